"""The subcommands of ``fullgraph``, one module each, registered by :mod:`fullgraph.cli`.

Each module's ``register(subparsers)`` adds its parser and handler. The commands that run on
ranks (``train``, ``predict``, ``minibatch``) generate their options from the configuration
dataclasses and run on the shared scaffold of :class:`~fullgraph.run.command.Command`; the
offline stages (``data``, ``partition``, ``verify``) and ``plan`` / ``export`` run in one
process. This is the top floor: a command may use every wing below it.
"""
