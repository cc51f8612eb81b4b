"""The ``gloo`` / ``nccl`` transports: torch.distributed process groups behind a Communicator.

Bootstrap: under an MPI launcher rank 0 binds a free port (port 0, read back) and publishes
``tcp://host:port`` with an MPI broadcast; under ``torchrun`` the ``MASTER_ADDR`` /
``MASTER_PORT`` rendezvous (``env://``) is used. The process group's timeout bounds every
collective. Sums are not the backend's ``all_reduce``: the base class adds in rank order over
``all_to_all_single`` (on ``self.device``, so host tensors travel through the GPU for nccl).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.launch import LaunchInfo
from fullgraph.errors import ConfigError


class TorchCommunicator(Communicator):
    """``torch.distributed`` (``gloo`` on CPU, ``nccl`` on CUDA) with its own process group.

    Args:
        backend: ``gloo`` or ``nccl``.
        info: rank and size from the launcher.
        timeout_s: process-group timeout for every collective.
    """

    def __init__(self, backend: str, info: LaunchInfo, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist

        super().__init__(info.rank, info.size, timeout_s)
        self.transport = backend
        self._dist = dist
        self._mpi_comm = None
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise ConfigError("transport nccl needs CUDA, but torch sees no GPU")
            self.device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        if info.launcher == "torchrun":
            init_method = "env://"
        elif info.size == 1:
            init_method = f"tcp://127.0.0.1:{_free_port('127.0.0.1')}"
        else:
            from mpi4py import MPI

            self._mpi_comm = MPI.COMM_WORLD
            address = None
            if info.rank == 0:
                host = socket.gethostname()
                address = f"tcp://{host}:{_free_port('')}"
            init_method = self._mpi_comm.bcast(address, root=0)
        self._group = dist.init_process_group(
            backend,
            init_method=init_method,
            rank=info.rank,
            world_size=info.size,
            timeout=timedelta(seconds=timeout_s),
        )
        self._timeout = timedelta(seconds=timeout_s)

    def _alltoallv(
        self, send: torch.Tensor, recv: torch.Tensor, send_rows: list[int], recv_rows: list[int]
    ) -> Callable[[], None]:
        if self.size == 1:
            recv.copy_(send)
            return lambda: None
        work = self._dist.all_to_all_single(
            recv, send, output_split_sizes=recv_rows, input_split_sizes=send_rows, async_op=True
        )

        def wait() -> None:
            work.wait(self._timeout)

        return wait

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        # Maxima and the barrier only: sums go in rank order through ``_alltoallv``
        # (Communicator.allreduce_), as gloo and nccl add in an order of their own choosing.
        if self.size == 1:
            return
        red = self._dist.ReduceOp.SUM if op == "sum" else self._dist.ReduceOp.MAX
        buf = tensor.to(self.device)  # nccl reduces device tensors; host metrics go through it
        self._dist.all_reduce(buf, op=red, async_op=True).wait(self._timeout)
        if buf is not tensor:
            tensor.copy_(buf)

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        if self.size == 1:
            return
        buf = tensor.to(self.device)
        self._dist.broadcast(buf, src=root, async_op=True).wait(self._timeout)
        if buf is not tensor:
            tensor.copy_(buf)

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj)
        return out

    def abort(self, code: int = 1) -> None:
        """Abort the job: through MPI when an MPI launcher started it, else exit this rank."""
        if self._mpi_comm is not None:
            self._mpi_comm.Abort(code)
        os._exit(code)

    def close(self) -> None:
        """Destroy the process group, in step with the other ranks.

        A rank that exits while a peer is still tearing down its gloo pairs can make that peer
        die in ``std::terminate`` (exit 6, about one run in four here): every rank first meets
        in a barrier, destroys its group, then waits on an MPI barrier before it may exit.
        """
        if self._dist.is_initialized():
            self.barrier()
            self._dist.destroy_process_group()
            if self._mpi_comm is not None:
                self._mpi_comm.Barrier()


def _free_port(host: str) -> int:
    """A TCP port that was free a moment ago (bind port 0, read it back, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
