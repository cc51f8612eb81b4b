"""The commands that run on ranks (``fullgraph train``, ``minibatch``) and ``fullgraph plan``.

Each module holds one subcommand: its ``register(subparsers)`` adds the options (generated from
the configuration dataclasses), and a :class:`~fullgraph.run.command.Command` subclass runs it
on the shared scaffold. This is the top floor: a command may use every wing below it.
"""
