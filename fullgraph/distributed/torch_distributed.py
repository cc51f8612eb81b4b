"""The ``gloo`` / ``nccl`` transports: torch.distributed process groups behind a Communicator.

Set-up, bounded by the communicator's timeout as every collective is:

1. rendezvous store: under ``torchrun`` the ``MASTER_ADDR`` / ``MASTER_PORT`` store (the agent's
   when it runs one); under ``srun`` without a PMI one on the step's first node, at a port
   derived from the job id (:func:`~fullgraph.distributed.launch.rendezvous_endpoint`); under
   an MPI launcher rank 0 opens a store on a free port and publishes an address every rank
   reaches directly (:func:`~fullgraph.distributed.network.
   rendezvous_address`, chosen from every rank's interfaces, gathered over MPI);
2. interface: each rank points gloo at the interface that routes to the rendezvous address
   (``GLOO_SOCKET_IFNAME``, unless the user set it), so a host name that resolves to a
   loopback address no longer breaks the mesh across nodes;
3. every rank registers its probe endpoint in the store and waits for all the others: a rank
   that never comes is named ("rank 3 never joined ...");
4. the process group (gloo connects its full mesh); a failure names the peers that do not
   answer a connection probe.

A watchdog thread ends the rank with one line if set-up outlasts the timeout by
:data:`SETUP_GRACE_S` anyway (a C++ call blocked past its own timeout). Sums are not the
backend's ``all_reduce``: the base class adds in rank order over ``all_to_all_single`` (on
``self.device``, so host tensors travel through the GPU for nccl).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.launch import LaunchInfo, rendezvous_endpoint
from fullgraph.distributed.network import (
    PeerProbe,
    describe_unreachable,
    interfaces,
    rendezvous_address,
    resolve,
    use_interface_for,
    wait_for_listener,
)
from fullgraph.errors import ConfigError, PeerUnreachable, one_line

#: Seconds the set-up watchdog allows beyond the timeout before it ends the rank itself.
SETUP_GRACE_S = 10.0


class TorchCommunicator(Communicator):
    """``torch.distributed`` (``gloo`` on CPU, ``nccl`` on CUDA) with its own process group.

    Args:
        backend: ``gloo`` or ``nccl``.
        info: rank and size from the launcher.
        timeout_s: bound of the set-up and of every collective.
        label: prefix of the watchdog's message (``fullgraph train``).

    Raises:
        PeerUnreachable: the rendezvous or a peer could not be reached within ``timeout_s``.
    """

    def __init__(
        self, backend: str, info: LaunchInfo, timeout_s: float = 300.0, label: str = "fullgraph"
    ) -> None:
        import torch.distributed as dist

        super().__init__(info.rank, info.size, timeout_s)
        self.transport = backend
        self._dist = dist
        self._mpi_comm = None
        self._timeout = timedelta(seconds=timeout_s)
        self.interface: str | None = None
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise ConfigError("transport nccl needs CUDA, but torch sees no GPU")
            self.device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        if info.under_mpi and info.size > 1:
            from fullgraph.distributed.mpi import init_mpi

            self._mpi_comm = init_mpi(timeout_s).COMM_WORLD  # bounded, unlike mpi4py's import
        self._where = "before the rendezvous"
        self._route_host: str | None = None  # the host whose route picks gloo's interface
        with self._watchdog(label):
            deadline = time.monotonic() + timeout_s
            store, host, port = self._rendezvous(info, deadline)
            self._where = f"rendezvous {host}:{port}"
            if backend == "gloo":
                self.interface = use_interface_for(self._route_host or host)
            self._where += f", interface {self.interface or 'default'}"
            self._join(store, host, port, deadline)
            try:
                with _cpp_errors_quiet():
                    self._group = dist.init_process_group(
                        backend,
                        store=dist.PrefixStore("fullgraph/pg", store),
                        rank=info.rank,
                        world_size=info.size,
                        timeout=self._timeout,
                    )
            except RuntimeError as exc:
                raise self._setup_error(f"{backend} could not connect every rank", exc) from None

    # -- set-up ------------------------------------------------------------------------------
    def _rendezvous(
        self, info: LaunchInfo, deadline: float
    ) -> tuple[torch.distributed.TCPStore, str, int]:
        """The store every rank shares, and the address and port it is reached at."""
        dist, left = self._dist, timedelta(seconds=max(1.0, deadline - time.monotonic()))
        # torchrun's MASTER_ADDR:MASTER_PORT, or srun without a PMI: the step's first node.
        endpoint = rendezvous_endpoint(info)
        if endpoint is not None:
            host, port = endpoint.host, endpoint.port
            self._route_host = endpoint.interface_host
            # Under the torchrun agent its store already listens there; every worker is a client.
            is_master = endpoint.opens_store
            if not is_master:
                error = wait_for_listener(host, port, deadline)
                if error is not None:
                    raise PeerUnreachable(
                        f"could not reach the rendezvous {host}:{port} within "
                        f"{self.timeout_s:g} s: {error}"
                    )
                left = timedelta(seconds=max(1.0, deadline - time.monotonic()))
            self._where = endpoint.source
            try:
                with _cpp_errors_quiet():
                    store = dist.TCPStore(
                        host, port, info.size, is_master, timeout=left, wait_for_workers=False
                    )
            except RuntimeError as exc:
                raise self._setup_error(
                    f"could not reach the rendezvous {host}:{port}", exc
                ) from None
            return store, host, port
        if info.size == 1:
            store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=left)
            return store, "127.0.0.1", int(store.port)
        # An MPI launcher: rank 0 opens the store and publishes an address every rank reaches.
        from fullgraph.distributed.mpi import MPICommunicator

        boot = MPICommunicator(max(1.0, deadline - time.monotonic()))
        per_rank = boot.allgather_object(interfaces())
        chosen: tuple[str, int] | None = None
        store = None
        if info.rank == 0:
            host = rendezvous_address(per_rank, resolve(socket.gethostname()))
            with _cpp_errors_quiet():
                store = dist.TCPStore(
                    "0.0.0.0", 0, info.size, True, timeout=left, wait_for_workers=False
                )
            chosen = (host, int(store.port))
        host, port = boot.allgather_object(chosen)[0]
        if store is None:
            self._where = "published by rank 0"
            try:
                with _cpp_errors_quiet():
                    store = dist.TCPStore(host, port, info.size, False, timeout=left)
            except RuntimeError as exc:
                raise self._setup_error(
                    f"could not reach the rendezvous {host}:{port}", exc
                ) from None
        return store, host, port

    def _join(self, store: torch.distributed.Store, host: str, port: int, deadline: float) -> None:
        """Register this rank's probe endpoint; wait for every rank's; name those missing."""
        probe = PeerProbe()
        prefix = f"fullgraph/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/peer/"
        store.set(f"{prefix}{self.rank}", pickle.dumps(probe.endpoint))
        keys = [f"{prefix}{r}" for r in range(self.size)]
        left = max(1.0, deadline - time.monotonic())
        try:
            store.wait(keys, timedelta(seconds=left))
        except RuntimeError:
            try:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
            except RuntimeError:  # the store itself is gone (rank 0 died)
                missing = []
            who = (
                ", ".join(f"rank {r}" for r in missing) + " never joined"
                if missing
                else "the rendezvous store stopped answering"
            )
            raise PeerUnreachable(
                f"{who} the rendezvous at {host}:{port} within {self.timeout_s:g} s"
            ) from None
        probe.set_peers([pickle.loads(store.get(k)) for k in keys], self.rank)
        self.probe = probe

    def _setup_error(self, what: str, exc: BaseException) -> PeerUnreachable:
        """A set-up failure as one line: what failed, who does not answer, the cause."""
        who = ""
        if self.probe is not None:
            who = "; " + describe_unreachable(
                self.probe.unreachable(), self.probe, self.size, self.rank
            )
        cause = one_line(exc)
        if len(cause) > 300:
            cause = cause[:300] + " ..."
        # a server answered, but not with a store's handshake (or dropped the connection)
        if any(s in cause for s in ("Ping failed", "Broken pipe", "Connection reset")):
            cause += " (something else listens there, not a torch.distributed store)"
        return PeerUnreachable(f"{what} within {self.timeout_s:g} s ({self._where}){who}: {cause}")

    @contextmanager
    def _watchdog(self, label: str) -> Iterator[None]:
        """End this rank with one line if set-up lasts past the timeout plus a grace period."""
        done = threading.Event()
        limit = self.timeout_s + SETUP_GRACE_S

        def watch() -> None:
            if done.wait(limit):
                return
            sys.stderr.write(
                f"{label}: error: rank {self.rank}: could not set up the {self.transport} "
                f"connections within {limit:g} s ({self._where})\n"
            )
            sys.stderr.flush()
            self.abort(PeerUnreachable.exit_code)

        thread = threading.Thread(target=watch, name="fullgraph-setup-watchdog", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()

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
            with _backend_errors():
                work.wait(self._timeout)

        return wait

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        # Maxima and the barrier only: sums go in rank order through ``_alltoallv``
        # (Communicator.allreduce_), as gloo and nccl add in an order of their own choosing.
        if self.size == 1:
            return
        red = self._dist.ReduceOp.SUM if op == "sum" else self._dist.ReduceOp.MAX
        buf = tensor.to(self.device)  # nccl reduces device tensors; host metrics go through it
        with _backend_errors():
            self._dist.all_reduce(buf, op=red, async_op=True).wait(self._timeout)
        if buf is not tensor:
            tensor.copy_(buf)

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        if self.size == 1:
            return
        buf = tensor.to(self.device)
        with _backend_errors():
            self._dist.broadcast(buf, src=root, async_op=True).wait(self._timeout)
        if buf is not tensor:
            tensor.copy_(buf)

    def _allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        with _backend_errors():
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
        super().close()


def _c10_log_level() -> ctypes.c_int | None:
    """c10's ``FLAGS_caffe2_log_level`` (the level ``TORCH_CPP_LOG_LEVEL`` sets at import), as
    a ctypes int, or ``None`` where libc10 does not export it."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return None


@contextmanager
def _cpp_errors_quiet() -> Iterator[None]:
    """No C++ log lines below FATAL while the body runs (c10d connecting to a store).

    c10d logs a failed store connection at ERROR (shown by ``TORCH_CPP_LOG_LEVEL=ERROR``) with
    its whole C++ stack trace before the exception reaches Python; that exception becomes our
    one line, which names the address. c10 reads the level at every message, so it is raised
    for the call and restored after; ``TORCH_CPP_LOG_LEVEL=INFO`` (or ``WARNING``) keeps
    everything shown.
    """
    level = _c10_log_level()
    if level is None or level.value < 2:  # the user asked for INFO or WARNING: leave it
        yield
        return
    before, level.value = level.value, 3
    try:
        yield
    finally:
        level.value = before


@contextmanager
def _backend_errors() -> Iterator[None]:
    """A backend's failure in a collective as :class:`TimeoutError` (it timed out) or
    :class:`ConnectionError` (a connection broke), for :meth:`Communicator._peer_failures`."""
    try:
        yield
    except RuntimeError as exc:
        message = one_line(exc)
        if "timed out" in message.lower() or "timeout" in message.lower():
            raise TimeoutError(message) from exc
        raise ConnectionError(message) from exc
