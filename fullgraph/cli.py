"""The ``fullgraph`` command: one entry point, one subcommand per stage.

Each subcommand is one module of :mod:`fullgraph.commands` and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func`` (called with the parsed
namespace, returning an exit code). Only the chosen subcommand's module is imported (the others
get a one-line entry for ``--help``), and heavy work happens inside the handlers, so that
``fullgraph --help`` and ``fullgraph data ...`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import socket
import sys
import typing
from collections.abc import Sequence

from fullgraph.errors import (
    FullgraphError,
    is_presumed_replicated,
    is_replicated,
    one_line,
    out_of_memory,
)
from fullgraph.resources import import_one_at_a_time, process_defaults
from fullgraph.watchdog import Terminated, Watchdog, end_by_sigterm, launched_ranks

#: (module, name, summary) of every subcommand, in the order ``--help`` lists them.
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("fullgraph.commands.data", "data", "generate synthetic datasets, describe datasets on disk"),
    (
        "fullgraph.commands.partition",
        "partition",
        "split a dataset into P per-rank parts (METIS, random or contiguous)",
    ),
    (
        "fullgraph.commands.verify",
        "verify",
        "check a partition directory: ownership, edges, halo maps, checksums",
    ),
    (
        "fullgraph.commands.train",
        "train",
        "train a GNN full-batch: --model gcn, sage, gat, gin, graphconv, mlp, appnp, sgc or "
        "sign (mpirun -n P for P ranks)",
    ),
    (
        "fullgraph.commands.predict",
        "predict",
        "predict every node with a trained model (mpirun -n P for P ranks)",
    ),
    (
        "fullgraph.commands.plan",
        "plan",
        "predict every rank's peak memory for a partition and model, before running",
    ),
    (
        "fullgraph.commands.minibatch",
        "minibatch",
        "train GraphSAGE with neighbour sampling (the mini-batch baseline)",
    ),
    (
        "fullgraph.commands.export",
        "export",
        "export a trained model (--save-model) to a plain PyG model",
    ),
]


#: The subcommands that run as ranks: their heavy libraries load one at a time
#: (:func:`~fullgraph.resources.import_one_at_a_time`).
RANK_COMMANDS = frozenset({"train", "predict", "minibatch"})


def summary(name: str) -> str:
    """The one-line summary of subcommand ``name`` that ``fullgraph --help`` lists."""
    return next(text for _, command, text in SUBCOMMANDS if command == name)


#: A word that starts like a negative number (``-1,5`` for ``--fanouts``, ``-1e-3``): the value
#: of the option before it, never an option (argparse's own pattern takes plain numbers only).
NEGATIVE_VALUE = re.compile(r"^-(\d|\.\d)[\d,.eE+-]*$")
_MISSING_VALUE = re.compile(r"^argument (-[^ :/]+)(?:/\S+)?: expected one argument$")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and where ``--help`` is), exit status 2.

    Values that start like negative numbers (``--fanouts -1,5``) are values, not options.
    """

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE

    def error(self, message: str) -> typing.NoReturn:
        """Print ``PROG: error: MESSAGE (see PROG --help)`` and exit 2; an option left without
        its value is told how to give one that starts with ``-`` (``--name=-x``)."""
        missing = _MISSING_VALUE.match(message)
        if missing:
            opt = missing.group(1)
            message += f" (a value that starts with '-' goes as {opt}=VALUE)"
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first argument not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser.

    Args:
        argv: the command line about to be parsed: only the subcommand it names is registered
            in full (with none named, as for the top-level ``--help``, every subcommand gets its
            one-line entry only). ``None`` registers every subcommand in full.
    """
    parser = OneLineParser(
        prog="fullgraph",
        description=(
            "Full-batch distributed GNN training with exact full-graph gradients. "
            "Typical flow: `fullgraph data synth` (or data already on disk) -> "
            "`fullgraph partition` -> `fullgraph verify` -> `mpirun -n P fullgraph train`."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    names = {name for _, name, _ in SUBCOMMANDS}
    chosen = _chosen(argv) if argv is not None else None
    for module_name, name, summary in SUBCOMMANDS:
        if argv is not None and chosen != name and (chosen in names or chosen is None):
            sub.add_parser(name, help=summary)
            continue
        importlib.import_module(module_name).register(sub)
    return parser


def _replicated_prefix(exc: BaseException) -> str | None:
    """Whether and how this rank prints an error every rank raised alike: ``""`` on rank 0
    (and without a launcher); for an error presumed alike (a check before the ranks could
    compare), ``"rank R on HOST: "`` on the first rank of every other node (node-local state,
    a partition missing on one node, fails there alone, and rank 0 cannot say it); ``None``
    otherwise (the line would repeat rank 0's)."""
    from fullgraph.distributed.launch import detect_launch

    try:
        info = detect_launch()
    except FullgraphError:
        return ""
    if info.rank == 0:
        return ""
    if info.local_rank == 0 and is_presumed_replicated(exc):
        return f"rank {info.rank} on {socket.gethostname()}: "
    return None


def _terminated(label: str) -> int:
    """Print the SIGTERM line; returns its exit status."""
    print(f"{label}: terminated (SIGTERM)", file=sys.stderr)
    return TERMINATED


#: The exit status of a process ended by SIGTERM.
TERMINATED = 128 + signal.SIGTERM


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; user errors print one line and exit 2.

    SIGTERM is handled like SIGINT from the first line on, imports included: clean-ups run,
    one line is printed, the exit status is ``128 + signal``. The process watchdog
    (:mod:`fullgraph.watchdog`) is installed first: it honours SIGTERM while the main thread is
    in native code, bounds the start-up phases and ends a rank whose launcher died. A rank of a
    job of several that reaches the end here after SIGTERM has not ended the job through MPI
    (training's own SIGTERM path does, with ``MPI_Abort``; before MPI is up nothing can): it
    dies of SIGTERM after its line and clean-ups, so that its launcher ends the other ranks
    (MPICH's hydra ends a job at once when a rank dies of a signal, but leaves the others
    waiting in MPI initialisation, up to ``--timeout``, when it exits with a status).
    """
    code = _main(argv)
    if code == TERMINATED and launched_ranks() > 1:
        end_by_sigterm()
    return code


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` up to the end of the command: its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = _chosen(argv)
    label = f"fullgraph {chosen}" if chosen in {n for _, n, _ in SUBCOMMANDS} else "fullgraph"
    watchdog = Watchdog(label)
    try:
        watchdog.install()  # inside: SIGTERM may land while its thread starts
        # Before torch loads (building the parser imports it): GNU OpenMP reads OMP_WAIT_POLICY
        # and c10 TORCH_CPP_LOG_LEVEL once, when they load (set later, a one-process run's 2
        # threads spun against a loaded machine, and c10d's warnings buried the failure line).
        process_defaults()
        if chosen in RANK_COMMANDS:  # a lower start-up peak on every rank (docs/scale.md)
            import_one_at_a_time()
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except (FullgraphError, FileExistsError, FileNotFoundError, PermissionError) as exc:
        code = exc.exit_code if isinstance(exc, FullgraphError) else 2
        prefix = _replicated_prefix(exc) if is_replicated(exc) else ""
        if prefix is not None:
            print(f"{label}: error: {prefix}{one_line(exc)}", file=sys.stderr)
        return code
    except (MemoryError, RuntimeError) as exc:
        words = [a for a in argv if not a.startswith("-")][:2]  # "data synth": its own levers
        oom = out_of_memory(exc, " ".join(words) if chosen == "data" else chosen or "")
        if oom is None:
            if watchdog.terminated:
                return _terminated(label)
            raise
        print(f"{label}: error: {one_line(oom)}", file=sys.stderr)
        return oom.exit_code
    except Terminated:
        return _terminated(label)
    except Exception:
        # SIGTERM that landed in an extension's start-up (numpy turns any error there into
        # ImportError) is still SIGTERM: the same line and status
        if watchdog.terminated:
            return _terminated(label)
        raise
    except KeyboardInterrupt:
        print(f"{label}: interrupted", file=sys.stderr)
        return 130
    finally:
        watchdog.uninstall()


if __name__ == "__main__":
    sys.exit(main())
