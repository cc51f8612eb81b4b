"""The process of a ``fullgraph.pyg`` script: its environment, communicator and failures.

A script is not started by the ``fullgraph`` command line, so this module gives it what
:meth:`fullgraph.run.command.Command.execute` gives a command:

- the environment defaults (:func:`~fullgraph.resources.process_defaults`:
  ``OMP_WAIT_POLICY=PASSIVE``, ...), set when ``fullgraph.pyg`` is imported if GNU OpenMP has
  not been loaded yet (:func:`set_defaults`). GNU OpenMP reads the wait policy once, when it is
  loaded, i.e. by ``import torch``: set afterwards it has no effect (measured, docs/pyg.md), so a
  script that imported torch first and runs several threads gets one line on rank 0 naming the
  fix (:func:`wait_policy_note`);
- the rank start-up of the commands (:func:`communicator`, through
  :func:`fullgraph.run.rank_start.start_rank`): the memory policy, the threads, the process
  watchdog's deadlines, the communicator of the launcher, and the same abort lines, labelled
  ``fullgraph.pyg``; what is the script's own stays here: the watchdog leaves its signal
  handling alone, and one process keeps its thread setting unless ``threads`` is given;
- one failure policy (:func:`end_on_errors`): an uncaught fullgraph error is one line, and
  with several ranks any uncaught exception that not every rank raised alike ends the whole job
  (``MPI_Abort`` under an MPI launcher; else this rank exits and the launcher ends the others),
  as :func:`fullgraph.distributed.faults.run_on_every_rank` does for a command. A rank that
  merely exited would leave the others waiting (at the end, ``MPI_Finalize`` waits for a peer
  that stalled in the script's own code forever).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from fullgraph.errors import (
    FullgraphError,
    is_replicated,
    one_line,
    out_of_memory,
)

if TYPE_CHECKING:
    from fullgraph.distributed import Communicator

T = TypeVar("T")
#: ``sys.excepthook``'s type.
ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]

#: ``True`` once :func:`set_defaults` found GNU OpenMP already loaded (too late for its policy).
_OPENMP_LOADED_FIRST = False

#: The prefix of the lines of a script's process.
LABEL = "fullgraph.pyg"

#: The line of a script whose OpenMP started before ``OMP_WAIT_POLICY`` could be set.
WAIT_POLICY_NOTE = (
    "fullgraph.pyg: note: OMP_WAIT_POLICY is not set and torch loaded its OpenMP before "
    "fullgraph.pyg could set it: between operators {threads} threads spin, and a loaded machine "
    "runs several times slower; run `OMP_WAIT_POLICY=PASSIVE python SCRIPT` (or import "
    "fullgraph.pyg before torch)"
)


def openmp_loaded() -> bool:
    """Whether GNU OpenMP (``libgomp``) is mapped into this process (``/proc/self/maps``);
    ``False`` where that cannot be read."""
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def set_defaults() -> None:
    """Set the environment defaults of a training process while they can still take effect.

    Called when ``fullgraph.pyg`` is imported: before GNU OpenMP is loaded (``import torch``
    loads it) the defaults are set as the command line sets them; after, the wait policy would
    have no effect, and :func:`wait_policy_note` says so once.
    """
    global _OPENMP_LOADED_FIRST
    if openmp_loaded():
        _OPENMP_LOADED_FIRST = "OMP_WAIT_POLICY" not in os.environ
        return
    from fullgraph.resources import process_defaults

    process_defaults()


def wait_policy_note(threads: int) -> str | None:
    """The line for rank 0 when OpenMP started with its default (spinning) wait policy and
    the rank runs ``threads`` > 1 threads; ``None`` otherwise (one thread never waits for a
    sibling)."""
    if not _OPENMP_LOADED_FIRST or threads <= 1 or "OMP_WAIT_POLICY" in os.environ:
        return None
    return WAIT_POLICY_NOTE.format(threads=threads)


class _ScriptFailures:
    """``sys.excepthook`` of a script's process (:func:`end_on_errors`); one per process, its
    communicator set once the rank has one."""

    def __init__(self, previous: ExceptHook, rank: int, size: int) -> None:
        self.previous, self.rank, self.size = previous, rank, size
        self.comm: Communicator | None = None

    def __call__(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        from fullgraph.distributed.faults import abort_job

        alike = bool(getattr(value, "alike", False)) or is_replicated(value)
        if self.comm is not None and self.size > 1 and not alike:
            abort_job(self.comm, "", value, label=LABEL)  # never returns
        value = out_of_memory(value) or value
        if not isinstance(value, FullgraphError):
            self.previous(kind, value, tb)
            return
        if self.rank == 0 or not alike:
            sys.stderr.flush()
            # one write: the lines of several ranks sharing a pipe never interleave
            os.write(2, f"{LABEL}: error: {one_line(value)}\n".encode())


def end_on_errors(rank: int, size: int, comm: Communicator | None = None) -> None:
    """Install the script's failure policy (see the module docstring) as ``sys.excepthook``,
    or give the one installed this rank's communicator.

    An uncaught :class:`~fullgraph.errors.FullgraphError` is one line on standard error,
    ``fullgraph.pyg: error: MESSAGE`` (no traceback). An error every rank raised alike
    (``alike``, or marked replicated: agreed by a collective, or a check made alike before the
    communicator) is printed by rank 0 only and every rank exits with status 1. Once the rank
    has its communicator (``comm``), with several ranks any other uncaught exception, Ctrl-C
    and SIGTERM included, is printed by its rank, naming it (a traceback unless it is a
    fullgraph error), and ends the whole job (:func:`~fullgraph.distributed.faults.abort_job`;
    its exit status the error's ``exit_code``, e.g. 4 for a peer that stopped answering), as
    :func:`~fullgraph.distributed.faults.run_on_every_rank` does for a command. Before it, a
    rank's own error is its own line (a peer unreachable in the set-up ends the job:
    :func:`~fullgraph.run.rank_start.start_rank`).
    """
    hook = sys.excepthook
    if not isinstance(hook, _ScriptFailures):
        hook = _ScriptFailures(sys.excepthook, rank, size)
        sys.excepthook = hook
    hook.rank, hook.size, hook.comm = rank, size, comm


def alike(comm: Communicator, fn: Callable[[], T]) -> T:
    """``fn()`` (local work, no collectives) on every rank; when it fails with bad input on any
    rank, every rank raises the first failing rank's error, marked ``alike`` so that rank 0 alone
    prints it and every rank exits (:func:`fullgraph.distributed.faults.agree`)."""
    from fullgraph.distributed.faults import agree

    try:
        return agree(comm, fn)
    except FullgraphError as exc:
        exc.alike = True  # type: ignore[attr-defined]
        raise


def communicator(threads: int | None, timeout_s: float, transport: str = "auto") -> Communicator:
    """The communicator of the launcher that started us (closed at exit), started as a command
    starts its rank (:func:`~fullgraph.run.rank_start.start_rank`: the memory policy, the
    threads, the watchdog's deadlines and the set-up's abort lines, labelled ``fullgraph.pyg``).

    The process watchdog (:mod:`fullgraph.watchdog`, installed here unless the process has one)
    bounds the set-up and :func:`~fullgraph.pyg.load_part` by ``timeout_s`` and ends the rank
    if its launcher dies; it leaves the script's signal handling alone. The script's uncaught
    exceptions, the set-up's included, follow :func:`end_on_errors`. Rank 0 prints
    :func:`wait_policy_note` when it applies.

    Args:
        threads: compute threads of this rank (default with several ranks: the node's cores
            divided by its ranks; one process keeps its own setting).
        timeout_s: seconds the set-up and every collective may wait for the other ranks.
        transport: ``auto`` (``mpi`` under an MPI launcher, ``gloo`` under ``torchrun``),
            ``mpi``, ``gloo`` or ``nccl``, as ``fullgraph train --transport``.
    """
    from fullgraph.distributed import detect_launch, resolve_transport
    from fullgraph.run.rank_start import start_rank
    from fullgraph.watchdog import Watchdog, current

    info = detect_launch()
    end_on_errors(info.rank, info.size)  # the set-up's own errors are lines too
    if current() is None:
        Watchdog(LABEL).install(signals=False)
    comm, n = start_rank(
        LABEL, info, resolve_transport(transport, info), timeout_s, threads, keep_threads=True
    )
    atexit.register(comm.close)
    end_on_errors(comm.rank, comm.size, comm)
    note = wait_policy_note(n)
    if note is not None and comm.rank == 0:
        print(note, file=sys.stderr, flush=True)
    return comm
