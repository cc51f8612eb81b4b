"""The ``mpi`` transport: mpi4py on host buffers (``Ialltoallv``; maxima by ``Iallreduce``).

MPI moves large messages only while a rank calls into it, so every wait polls its request
(:func:`wait_request`), which also bounds it by the communicator's timeout.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.watchdog import MPI_INIT_PHASE, phase

if TYPE_CHECKING:
    from mpi4py import MPI


def init_mpi(timeout_s: float | None = None) -> ModuleType:
    """mpi4py's ``MPI`` module, with MPI initialised in a way the watchdog can bound.

    mpi4py's own initialisation (at import) holds the GIL while ``MPI_Init`` waits for every
    rank, busy-polling: a rank whose peer is stopped or dead before it reaches ``MPI_Init``
    would wait forever, deaf to SIGTERM (no Python thread can run). Here mpi4py is imported
    without initialising MPI, ``MPI_Init_thread`` is called through ctypes (which releases the
    GIL) as the start-up phase ``MPI initialisation`` bounded by ``timeout_s``
    (:mod:`fullgraph.watchdog`), and mpi4py's settings are applied as its own start-up would:
    errors raise exceptions, ``MPI_Finalize`` runs at exit.

    Args:
        timeout_s: seconds MPI initialisation may wait for the other ranks (``None``: as
            long as it takes).

    Returns:
        The ``mpi4py.MPI`` module, MPI initialised (already initialised MPI is left as it is).
    """
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = True
    from mpi4py import MPI

    if MPI.Is_initialized():
        return MPI
    from fullgraph.distributed.launch import detect_launch, mpi_start_environment

    # srun --mpi=pmi2 and the MPICH wheel: the OFI network module (see mpi_start_environment)
    os.environ.update(mpi_start_environment(detect_launch(), MPI.Get_library_version()))
    provided = ctypes.c_int()
    with phase(MPI_INIT_PHASE, timeout_s):
        # The extension module's handle resolves the symbol in the libmpi it is linked to.
        init = ctypes.CDLL(MPI.__file__).MPI_Init_thread
        err = init(None, None, MPI.THREAD_MULTIPLE, ctypes.byref(provided))
    if err != 0:
        raise RuntimeError(f"MPI_Init_thread failed (error code {err})")
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
        comm.Set_errhandler(MPI.ERRORS_RETURN)
    return MPI


def wait_request(request: MPI.Request, timeout_s: float, what: str) -> None:
    """Drive an MPI request to completion; raise :class:`TimeoutError` after ``timeout_s``.

    MPI moves large messages only while a rank calls into it (no progress thread), so this
    polls ``Test`` without sleeping; ``sched_yield`` hands the core to another rank when the
    node is oversubscribed.
    """
    deadline = time.monotonic() + timeout_s
    polls = 0
    while not request.Test():
        polls += 1
        if polls % 256 == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"MPI {what} did not complete within {timeout_s:g} s")
            os.sched_yield()


def _words(t: torch.Tensor) -> np.ndarray:
    """``t``'s memory as a numpy array: bfloat16 (no numpy dtype) as its 16-bit words."""
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


class MPICommunicator(Communicator):
    """mpi4py on host buffers: ``Ialltoallv`` with per-peer counts, ``Iallreduce`` for maxima.

    Sums go through the all-to-all too, in rank order (:meth:`Communicator.allreduce_`).
    """

    transport = "mpi"

    def __init__(self, timeout_s: float = 300.0) -> None:
        MPI = init_mpi(timeout_s)

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        super().__init__(self._comm.Get_rank(), self._comm.Get_size(), timeout_s)

    def _alltoallv(
        self, send: torch.Tensor, recv: torch.Tensor, send_rows: list[int], recv_rows: list[int]
    ) -> Callable[[], None]:
        width = int(np.prod(send.shape[1:])) if send.dim() > 1 else 1
        scount = np.asarray(send_rows, dtype=np.int64) * width
        rcount = np.asarray(recv_rows, dtype=np.int64) * width
        sdispl = np.concatenate([[0], np.cumsum(scount)[:-1]])
        rdispl = np.concatenate([[0], np.cumsum(rcount)[:-1]])
        sbuf, rbuf = _words(send.detach()).reshape(-1), _words(recv).reshape(-1)
        req = self._comm.Ialltoallv([sbuf, (scount, sdispl)], [rbuf, (rcount, rdispl)])

        def wait(_alive: tuple = (sbuf, rbuf, scount, rcount, sdispl, rdispl)) -> None:
            # The default argument keeps the buffers alive until the request completes.
            wait_request(req, self.timeout_s, "all-to-all")

        return wait

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        if self.size == 1:
            return
        buf = tensor.numpy().reshape(-1)
        mpi_op = self._mpi.SUM if op == "sum" else self._mpi.MAX
        req = self._comm.Iallreduce(self._mpi.IN_PLACE, buf, op=mpi_op)
        wait_request(req, self.timeout_s, "all-reduce")

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        if self.size == 1:
            return
        req = self._comm.Ibcast(tensor.numpy().reshape(-1), root=root)
        wait_request(req, self.timeout_s, "broadcast")

    def _allgather_object(self, obj: Any) -> list[Any]:
        # Pickled; the sizes go first.
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        req = self._comm.Iallgather(np.array([data.size], dtype=np.int64), sizes)
        wait_request(req, self.timeout_s, "all-gather")
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        displ = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        req = self._comm.Iallgatherv(data, [out, (sizes, displ)])
        wait_request(req, self.timeout_s, "all-gather")
        return [pickle.loads(out[d : d + s].tobytes()) for d, s in zip(displ, sizes, strict=True)]

    def abort(self, code: int = 1) -> None:
        """Abort every rank of ``MPI.COMM_WORLD``, then end this process.

        MPICH's ``MPI_Abort`` may return once the process manager has been told (5.0 does);
        the rank must not go on, nor reach ``MPI_Finalize`` at exit, which waits for peers that
        are gone.
        """
        self._comm.Abort(code)
        os._exit(code)
