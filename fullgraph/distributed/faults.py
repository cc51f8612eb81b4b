"""What ranks do when one fails: agree on bad input and end alike, or say why and abort the job."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import (
    ConfigError,
    FullgraphError,
    PeerUnreachable,
    is_replicated,
    mark_replicated,
    one_line,
    out_of_memory,
)

T = TypeVar("T")

#: Seconds a failing rank waits after writing its error, so the launcher forwards it before the
#: abort tears the job down.
FLUSH_GRACE_S = 0.5

#: Seconds a rank that is not its group's speaker for a PeerUnreachable waits for the speaker's
#: abort before it reports the failure itself.
QUIET_WAIT_S = 3.0


def abort_job(
    comm: Communicator, command: str, exc: BaseException, label: str | None = None
) -> None:
    """Print ``exc`` as ``fullgraph COMMAND: ...`` naming this rank, then abort every rank.

    Bad input (:class:`FullgraphError`) is one line; anything else carries its traceback. The
    message goes out in a single write, since a launcher such as MPICH's hydra may drop what a
    rank writes after another process has started aborting the job. Of the ranks that see the
    same peers fail (:class:`PeerUnreachable`) only the lowest that still answers reports it;
    the others wait :data:`QUIET_WAIT_S` for its abort (and report it themselves if it does
    not come).

    Args:
        comm: the job's communicator (its ``abort`` ends every rank; it never returns).
        command: the subcommand name, for the message prefix.
        exc: the exception that ended this rank's work.
        label: the prefix of the message instead of ``fullgraph COMMAND`` (``fullgraph.pyg``).
    """
    label = label or f"fullgraph {command}"
    if isinstance(exc, PeerUnreachable) and not exc.speaker:
        time.sleep(QUIET_WAIT_S)
    exc = out_of_memory(exc, command) or exc
    if isinstance(exc, FullgraphError | FileExistsError | FileNotFoundError | PermissionError):
        message = f"{label}: error: rank {comm.rank}: {one_line(exc)}\n"
        code = exc.exit_code if isinstance(exc, FullgraphError) else 2
    elif isinstance(exc, KeyboardInterrupt):
        terminated = type(exc).__name__ == "Terminated"
        what = "terminated (SIGTERM)" if terminated else "interrupted"
        message = f"{label}: rank {comm.rank} {what}; ending every rank\n"
        code = 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    else:
        details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        message = f"{label}: rank {comm.rank} failed:\n{details}"
        code = 1
    sys.stderr.write(message)
    sys.stderr.flush()
    time.sleep(FLUSH_GRACE_S)
    comm.abort(code)


def agree(comm: Communicator, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it fails with bad input on any rank, fail alike on all.

    A check that only some ranks fail (a part file corrupted on one rank, an output directory
    only rank 0 writes) would leave the other ranks waiting in the next collective. Here every
    rank learns every rank's outcome (one all-gather) and all raise the first failing rank's
    error, marked replicated so that only rank 0 prints it; the job then ends cleanly with the
    error's exit status.

    Args:
        comm: the job's communicator.
        fn: the local work (no collectives inside).

    Returns:
        What ``fn`` returned on this rank.

    Raises:
        FullgraphError, FileExistsError, FileNotFoundError, PermissionError: the first failing
            rank's error (with ``rank r:`` in front when it was another rank's).
    """
    result: T | None = None
    error: BaseException | None = None
    try:
        result = fn()
    except (FullgraphError, FileExistsError, FileNotFoundError, PermissionError) as exc:
        error = exc
    if comm.size == 1:
        if error is not None:
            raise error
        return result  # type: ignore[return-value]
    summary = None
    if error is not None:
        code = error.exit_code if isinstance(error, FullgraphError) else 2
        summary = (one_line(error), code)
    outcomes = comm.allgather_object(summary)
    failed = [(r, o) for r, o in enumerate(outcomes) if o is not None]
    if not failed:
        return result  # type: ignore[return-value]
    rank, (message, code) = failed[0]
    if rank == comm.rank and error is not None:
        raise mark_replicated(error)
    exc = FullgraphError(f"rank {rank}: {message}")
    exc.exit_code = code
    raise mark_replicated(exc)


def run_on_every_rank(comm: Communicator, command: str, fn: Callable[[], T]) -> T:
    """Run a command's work on this rank and end the job consistently when it fails.

    - one process, or an error every rank raised alike (marked replicated): it propagates, so
      the command line prints it once (rank 0) and every rank exits with its status;
    - anything else on a rank of several, Ctrl-C and SIGTERM included: :func:`abort_job` names
      the rank and ends every rank (a rank that merely exited would leave its peers waiting).

    The communicator is closed when the work ends normally or alike on every rank.

    Args:
        comm: the job's communicator.
        command: the subcommand name, for messages.
        fn: the work.

    Returns:
        What ``fn`` returned.
    """
    try:
        result = fn()
    except BaseException as exc:
        if comm.size == 1 or is_replicated(exc) or isinstance(exc, SystemExit):
            comm.close()
            raise
        abort_job(comm, command, exc)
        raise
    comm.close()
    return result


def injected_failure_epoch(rank: int) -> int | None:
    """Epoch at which ``FULLGRAPH_FAIL_AT=rank:epoch`` asks this rank to raise, if any.

    Raises:
        ConfigError: the variable is set but not of the form ``rank:epoch`` (two integers).
    """
    spec = os.environ.get("FULLGRAPH_FAIL_AT")
    if not spec:
        return None
    r, _, e = spec.partition(":")
    if not (r.strip().isdigit() and e.strip().isdigit()):
        raise ConfigError(f"FULLGRAPH_FAIL_AT={spec!r} must be RANK:EPOCH (two integers)")
    return int(e) if int(r) == rank else None


def abort_setup(
    command: str, rank: int, under_mpi: bool, exc: BaseException, label: str | None = None
) -> None:
    """End this rank when its communicator could not be set up (no communicator to abort with).

    Prints ``fullgraph COMMAND: error: rank R: ...`` and ends the rank: under an MPI launcher
    through ``MPI_Abort`` (every rank ends), else with ``os._exit`` (the launcher, e.g. torchrun,
    ends this node's other ranks; the ranks elsewhere fail their own set-up within the timeout).
    ``label`` replaces the prefix ``fullgraph COMMAND`` (``fullgraph.pyg``).
    """
    code = exc.exit_code if isinstance(exc, FullgraphError) else 1
    label = label or f"fullgraph {command}"
    sys.stderr.write(f"{label}: error: rank {rank}: {one_line(exc)}\n")
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI") if under_mpi else None
    if mpi is not None and mpi.Is_initialized():  # (importing mpi4py here would start MPI)
        time.sleep(FLUSH_GRACE_S)
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)
