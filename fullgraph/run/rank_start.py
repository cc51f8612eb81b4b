"""One rank start-up, shared by the ``fullgraph`` commands and ``fullgraph.pyg`` scripts.

:meth:`fullgraph.run.command.Command.execute` and :func:`fullgraph.pyg.process.communicator`
both start a rank with :func:`start_rank`, so a script gets the command line's lines and
policies:

1. the memory policy: glibc gives freed blocks of 4 MiB or more back to the system
   (:func:`~fullgraph.resources.release_freed_memory`);
2. the process watchdog, when one is installed (:mod:`fullgraph.watchdog`), learns the rank:
   from here on it ends the rank when its launcher dies, and when a start-up phase outlasts
   the timeout (``LABEL: error: rank R: PHASE did not finish within T s; ...``, status 4);
   rank 0 says when a phase is still running (``notices``);
3. the compute threads, numba's and torch's (:func:`~fullgraph.kernels.cpu_launch.set_threads`):
   the given count, else the node's cores divided by its ranks;
4. the communicator, set up as the phase ``connection set-up`` with the same label; a peer
   unreachable there ends the job with ``LABEL: error: rank R: ...``
   (:func:`~fullgraph.distributed.faults.abort_setup`);
5. the libraries' pages that only the start-up touched leave the rank's resident set
   (:func:`~fullgraph.resources.drop_library_pages`; docs/scale.md, "the floor").

The checks made alike on every rank before it (:func:`checked_alike`) end with one line
printed by rank 0. The work after it runs under the caller's failure policy, which ends the job
the same way in both (:func:`~fullgraph.distributed.faults.abort_job`): a command's
:func:`~fullgraph.distributed.faults.run_on_every_rank`, a script's ``sys.excepthook``
(:func:`fullgraph.pyg.process.end_on_errors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fullgraph.errors import (
    DataError,
    FullgraphError,
    PartitionError,
    PeerUnreachable,
    mark_replicated,
)

if TYPE_CHECKING:
    from fullgraph.distributed import Communicator, LaunchInfo


@contextlib.contextmanager
def checked_alike() -> Iterator[None]:
    """Checks that every rank makes alike before the communicator exists (the options, the
    transport and device, a command's own checks): their error is marked replicated, so rank 0
    alone prints it and every rank exits with its status. Files may differ between nodes, so a
    data, partition or missing-file error is only presumed alike."""
    try:
        yield
    except (FullgraphError, FileExistsError, FileNotFoundError) as exc:
        node_local = isinstance(exc, (DataError, PartitionError, FileNotFoundError))
        raise mark_replicated(exc, presumed=node_local) from None


def start_rank(
    label: str,
    info: LaunchInfo,
    transport: str,
    timeout_s: float,
    threads: int | None,
    *,
    notices: bool = True,
    keep_threads: bool = False,
) -> tuple[Communicator, int]:
    """Start this rank (the steps of the module docstring); returns its communicator and the
    compute threads it runs.

    Args:
        label: prefix of the rank's lines (``fullgraph train``, ``fullgraph.pyg``).
        info: what the launcher says of this process
            (:func:`~fullgraph.distributed.launch.detect_launch`).
        transport: the resolved transport (``local``, ``mpi``, ``gloo``, ``nccl``).
        timeout_s: seconds each start-up phase and every collective may wait for the others.
        threads: compute threads; ``None``: the node's cores divided by its ranks.
        notices: rank 0 says when a start-up phase is still running.
        keep_threads: with ``threads=None`` and one rank, leave the process's thread setting
            (a script's own, or torch's default).

    Raises:
        ConfigError: the transport cannot run here (from
            :func:`~fullgraph.distributed.create_communicator`).
        PeerUnreachable: a one-rank set-up failed (with several ranks the job ends instead).
    """
    import torch

    from fullgraph.distributed import create_communicator, default_threads
    from fullgraph.distributed.faults import abort_setup
    from fullgraph.kernels.cpu_launch import set_threads
    from fullgraph.resources import drop_library_pages, release_freed_memory
    from fullgraph.watchdog import current, phase

    release_freed_memory()
    watchdog = current()
    if watchdog is not None:
        watchdog.attach(info, timeout_s, notices=notices)
    if threads is not None or info.size > 1 or not keep_threads:
        set_threads(threads or default_threads(info))
    try:
        with phase("connection set-up"):
            comm = create_communicator(transport, info, timeout_s, label=label)
    except PeerUnreachable as exc:
        if info.size == 1:
            raise
        abort_setup("", info.rank, info.under_mpi, exc, label=label)  # never returns
        raise
    drop_library_pages()  # every import and MPI's libraries are in by now
    return comm, torch.get_num_threads()
