"""The ``fullgraph`` command: one entry point, one subcommand per stage.

Each subcommand lives in the module that owns its work and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func`` (called with the parsed
namespace, returning an exit code). Modules are imported only to build the parser; heavy imports
(torch, numba) happen inside the handlers so that ``fullgraph --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from fullgraph.errors import FullgraphError, is_replicated, one_line

#: (module, summary) of every subcommand, in the order ``--help`` lists them.
SUBCOMMANDS: list[tuple[str, str]] = [
    ("fullgraph.datasets.cli", "data"),
    ("fullgraph.partition.cli", "partition"),
    ("fullgraph.partition.verify_cli", "verify"),
    ("fullgraph.train_cli", "train"),
    ("fullgraph.minibatch_cli", "minibatch"),
]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="fullgraph",
        description=(
            "Full-batch distributed GNN training with exact full-graph gradients. "
            "Typical flow: `fullgraph data synth` (or data already on disk) -> "
            "`fullgraph partition` -> `fullgraph verify` -> `mpirun -n P fullgraph train`."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name, _ in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``kill``, ``timeout`` and Slurm send) turned into an exception.

    It derives from :class:`KeyboardInterrupt` so that every clean-up that runs on Ctrl-C
    (temporary directories, partial files) runs on SIGTERM too.
    """


def _launcher_rank() -> int:
    """This process's rank as the launcher's environment says (0 when it says nothing)."""
    from fullgraph.launch import detect_launch

    try:
        return detect_launch().rank
    except FullgraphError:
        return 0


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; user errors print one line and exit 2.

    SIGTERM is handled like SIGINT: clean-ups run, one line is printed, the exit status is
    ``128 + signal``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return int(args.func(args) or 0)
    except (FullgraphError, FileExistsError, FileNotFoundError, PermissionError) as exc:
        code = exc.exit_code if isinstance(exc, FullgraphError) else 2
        if not (is_replicated(exc) and _launcher_rank() != 0):
            print(f"fullgraph {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return code
    except Terminated:
        print(f"fullgraph {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"fullgraph {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
