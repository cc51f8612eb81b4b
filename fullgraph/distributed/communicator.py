"""Communicators: all-to-all with per-peer counts, reductions and broadcasts over one transport.

A :class:`Communicator` is one object per process (no module-level state) built by
:func:`create_communicator` from the launcher's rank and size:

- ``local``: a single process; every collective is the identity.
- ``mpi``: mpi4py on host buffers (non-blocking ``Ialltoallv`` / ``Iallreduce``).
- ``gloo`` / ``nccl``: ``torch.distributed`` process groups. Under an MPI launcher rank 0 binds a
  free port and publishes ``tcp://host:port`` with an MPI broadcast; under ``torchrun`` the
  ``MASTER_ADDR`` / ``MASTER_PORT`` rendezvous is used.

Sums are added in one fixed order, whatever the transport: :meth:`Communicator.allreduce_`
scatters contiguous chunks with the exact all-to-all, adds the ranks' pieces left to right in
rank order and gathers the reduced chunks back (:func:`ordered_sum`), so a run at a given size
is bit-identical over ``mpi``, ``gloo`` and ``nccl``. Maxima use the transport's reduction.
:meth:`Communicator.tree_sum_` finishes the fixed block tree of
:mod:`fullgraph.distributed.tree_sum` over every rank's intervals: the same bits at any size.

Every wait of a collective lasts at most ``timeout_s`` seconds. A collective that times out or
whose connection breaks raises :class:`~fullgraph.errors.PeerUnreachable` naming the ranks that
no longer answer a connection probe (:class:`~fullgraph.distributed.network.PeerProbe`, opened
by :meth:`Communicator.start_probe`). Bytes sent by this rank to its peers are counted per tag in
:attr:`Communicator.bytes_sent`.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fullgraph.distributed.tree_sum import Label, combine
from fullgraph.errors import ConfigError, PeerUnreachable

if TYPE_CHECKING:
    from fullgraph.distributed.network import PeerProbe


class PendingExchange:
    """An all-to-all in flight; :meth:`wait` returns the received rows.

    Args:
        wait_fn: blocks until the data has landed (raising on timeout).
        recv: the buffer the data lands in, float [sum(recv_counts), width].
        on_done: called with the seconds spent waiting.
        send: the buffer being sent, held until the exchange completes, then released.
    """

    def __init__(
        self,
        wait_fn: Callable[[], None],
        recv: torch.Tensor,
        on_done: Callable[[float], None],
        send: torch.Tensor | None = None,
    ) -> None:
        self._wait_fn: Callable[[], None] | None = wait_fn
        self._recv = recv
        self._on_done = on_done
        self._send = send

    def wait(self) -> torch.Tensor:
        """Block until the exchange completes; return the received rows.

        Once the data has landed the send buffer is released, so that it is not kept alive
        while the caller computes with the received rows.
        """
        if self._wait_fn is not None:
            t0 = time.perf_counter()
            self._wait_fn()
            self._on_done(time.perf_counter() - t0)
            self._wait_fn = self._send = None
        return self._recv


class Communicator:
    """Collectives of one rank over one transport (``local`` base implementation).

    Attributes:
        rank: this process's rank.
        size: number of ranks.
        transport: the transport name.
        timeout_s: seconds any collective may wait before
            :class:`~fullgraph.errors.PeerUnreachable`.
        probe: this rank's listening socket and the other ranks' endpoints, once
            :meth:`start_probe` ran (``None`` before, and for one rank).
        bytes_sent: bytes this rank sent, per tag (``halo``, ``reduce``, ...).
        wait_s: seconds spent blocked in collectives, per tag.
    """

    transport = "local"

    def __init__(self, rank: int = 0, size: int = 1, timeout_s: float = 300.0) -> None:
        self.rank = rank
        self.size = size
        self.timeout_s = float(timeout_s)
        self.bytes_sent: dict[str, int] = defaultdict(int)
        self.wait_s: dict[str, float] = defaultdict(float)
        self.device = torch.device("cpu")
        self.probe: PeerProbe | None = None
        #: per tree key: (this rank's intervals, every rank's), exchanged once
        self._tree_labels: dict[str, tuple[Sequence[Label], list[list[Label]]]] = {}

    # -- hooks the transports override -------------------------------------------------------
    def _alltoallv(
        self, send: torch.Tensor, recv: torch.Tensor, send_rows: list[int], recv_rows: list[int]
    ) -> Callable[[], None]:
        recv.copy_(send)
        return lambda: None

    def _allreduce(self, tensor: torch.Tensor, op: str) -> None:
        return None

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        return None

    def _allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def abort(self, code: int = 1) -> None:
        """Terminate the whole job with exit status ``code`` (never returns)."""
        raise SystemExit(code)

    def close(self) -> None:
        """Release the transport's resources."""
        if self.probe is not None:
            self.probe.close()
            self.probe = None

    # -- failures of peers -------------------------------------------------------------------
    def start_probe(self) -> None:
        """Open this rank's probe socket and learn every rank's (a collective; no-op for one
        rank or when the transport's set-up already did it)."""
        if self.size == 1 or self.probe is not None:
            return
        from fullgraph.distributed.network import PeerProbe

        probe = PeerProbe()
        probe.set_peers(self.allgather_object(probe.endpoint), self.rank)
        self.probe = probe

    def unreachable_error(self, what: str, exc: BaseException) -> PeerUnreachable:
        """The error of a collective that timed out or lost a connection: which peers do not
        answer a probe now, and whether this rank is the one that reports it (the lowest rank
        that still answers)."""
        from fullgraph.distributed.network import describe_unreachable
        from fullgraph.watchdog import peers_note

        unreachable = self.probe.unreachable() if self.probe is not None else {}
        answering = set(range(self.size)) - set(unreachable)
        if isinstance(exc, TimeoutError):
            failed = f"{what} did not complete within {self.timeout_s:g} s"
        else:
            failed = f"{what} failed ({str(exc).splitlines()[0][:200] if str(exc) else exc!r})"
        return PeerUnreachable(
            f"{failed}; "
            + describe_unreachable(unreachable, self.probe, self.size, self.rank)
            + peers_note(),  # a stopped rank still answers a connection: this node's view
            unreachable,
            speaker=self.rank == min(answering | {self.rank}),
        )

    @contextlib.contextmanager
    def _peer_failures(self, what: str) -> Iterator[None]:
        """Turn a timeout or a broken connection inside a collective into PeerUnreachable."""
        try:
            yield
        except (TimeoutError, ConnectionError) as exc:
            raise self.unreachable_error(what, exc) from exc

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (small Python objects only)."""
        with self._peer_failures("all-gather"):
            return self._allgather_object(obj)

    # -- public collectives ------------------------------------------------------------------
    def alltoallv_start(
        self,
        send: torch.Tensor,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        tag: str = "halo",
    ) -> PendingExchange:
        """Start an all-to-all: rows ``send[off_q:off_q + send_counts[q]]`` go to rank ``q``.

        Args:
            send: rows to send, grouped by destination rank in ascending order.
            send_counts: rows for each destination rank.
            recv_counts: rows arriving from each source rank.
            tag: the counter the bytes and wait time are booked under.

        Returns:
            A :class:`PendingExchange`; its ``wait()`` gives the received rows grouped by
            source rank.

        Shapes:
            - ``send``: [sum(send_counts), W]; result: [sum(recv_counts), W].
        """
        send_rows, recv_rows = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        if len(send_rows) != self.size or len(recv_rows) != self.size:
            raise ConfigError(
                f"all-to-all needs {self.size} per-rank counts, got {len(send_rows)} and "
                f"{len(recv_rows)}"
            )
        send = send.contiguous()
        width = send.shape[1] if send.dim() == 2 else 1
        recv = _empty_like_rows(send, sum(recv_rows))
        peer_rows = sum(send_rows) - send_rows[self.rank]
        self.bytes_sent[tag] += peer_rows * width * send.element_size()
        with self._peer_failures("all-to-all"):
            wait_fn = self._alltoallv(send, recv, send_rows, recv_rows)

        def booked(seconds: float) -> None:
            self.wait_s[tag] += seconds

        def guarded() -> None:
            with self._peer_failures("all-to-all"):
                wait_fn()

        return PendingExchange(guarded, recv, booked, send)

    def allreduce_(
        self, tensor: torch.Tensor, op: str = "sum", tag: str = "reduce"
    ) -> torch.Tensor:
        """Reduce ``tensor`` in place over all ranks.

        ``sum`` adds the contributions in rank order, ``((t_0 + t_1) + t_2) + ...`` in the
        tensor's dtype, through two exact all-to-alls (a reduce-scatter of contiguous chunks,
        then an all-gather of the reduced chunks): the result is the same bit for bit on every
        rank, over every transport and from run to run. ``max`` uses the transport's reduction
        (its result does not depend on the order).

        Args:
            tensor: the values to reduce, overwritten with the result (any shape; for ``sum``
                float32 or float64, on the CPU or on the transport's device).
            op: ``sum`` or ``max``.
            tag: the counter the bytes and wait time are booked under.

        Returns:
            ``tensor``.

        Raises:
            ConfigError: ``op`` is neither ``sum`` nor ``max``.
            PeerUnreachable: a peer did not answer within ``timeout_s`` (one wait of an
                exchange) or a connection broke.
        """
        if op not in ("sum", "max"):
            raise ConfigError(f"unknown reduction {op!r} (expected sum or max)")
        t0 = time.perf_counter()
        with self._peer_failures("all-reduce"):
            if self.size > 1 and op == "sum":
                self._sum_in_rank_order(tensor, tag)
            else:
                if self.size > 1:
                    self.bytes_sent[tag] += tensor.numel() * tensor.element_size()
                self._allreduce(tensor, op)
        self.wait_s[tag] += time.perf_counter() - t0
        return tensor

    def _sum_in_rank_order(self, tensor: torch.Tensor, tag: str) -> None:
        """The fixed-order sum of :meth:`allreduce_` (``size > 1``); books the bytes sent.

        Rank ``r`` owns chunk ``r`` of the flattened vector (:func:`chunk_sizes`). It receives
        that chunk from every rank (its own piece is copied locally), adds the pieces with
        :func:`ordered_sum` and sends the sum to every rank: ``2 (P - 1) / P`` of the vector
        leaves each rank, like a ring all-reduce.
        """
        n = tensor.numel()
        if n == 0:
            return
        flat = tensor.detach().reshape(-1).to(self.device)
        counts = chunk_sizes(n, self.size)
        mine = counts[self.rank]
        pieces = _empty_like_rows(flat, self.size * mine)  # the one work buffer, ~n elements
        rows = pieces.view(self.size, mine)
        self._alltoallv(flat, pieces, counts, [mine] * self.size)()
        ordered_sum(rows, out=rows[0])
        rows[1:] = rows[0]  # the sum, once per destination rank
        # The first exchange has completed, so its send buffer may now receive the result.
        self._alltoallv(pieces, flat, [mine] * self.size, counts)()
        self.bytes_sent[tag] += (n - mine + (self.size - 1) * mine) * flat.element_size()
        if flat.device != tensor.device or flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view(tensor.shape))

    def tree_sum_(
        self,
        nodes: torch.Tensor,
        labels: list[Label],
        num_blocks: int,
        key: str = "grad",
        tag: str = "reduce",
    ) -> torch.Tensor:
        """The root of the block tree over every rank's intervals: the same bits for any
        assignment of whole blocks to ranks (:mod:`fullgraph.distributed.tree_sum`).

        Rank ``r`` owns chunk ``r`` of the vector (:func:`chunk_sizes`): it receives the
        chunk-``r`` slice of every rank's intervals (one exact all-to-all), pushes them in
        ascending block order on one :class:`~fullgraph.distributed.tree_sum.DyadicStack` and
        sends the root's chunk to every rank (a second all-to-all). The ranks' intervals are
        exchanged once per ``key`` and ``labels`` object and kept: they do not change between
        steps (a new layout's labels, a new object, are exchanged again). Each rank sends
        ``k (n - n/P) + (P - 1) n/P`` elements for its ``k`` intervals (``allreduce_``: ``k = 1``).

        Args:
            nodes: this rank's interval sums, [len(labels), n] (float32 or float64).
            labels: their tree nodes, ascending (``DyadicStack.labels``).
            num_blocks: blocks of the whole graph.
            key: names the layout whose intervals are cached (the same on every rank).
            tag: the counter the bytes and wait time are booked under.

        Returns:
            The root, a new tensor [n] of ``nodes``' dtype, the same on every rank.

        Raises:
            ValueError: ``nodes`` and ``labels`` disagree, or the ranks' intervals do not
                cover every block once.
            PeerUnreachable: a peer did not answer within ``timeout_s``.
        """
        held, labels = labels, [(int(a), int(b)) for a, b in labels]
        if nodes.dim() != 2 or nodes.shape[0] != len(labels):
            raise ValueError(f"tree_sum_: {len(labels)} labels for nodes of shape {nodes.shape}")
        n = int(nodes.shape[1])
        t0 = time.perf_counter()
        with self._peer_failures("tree reduction"):
            if self.size == 1:
                root = combine(num_blocks, [(labels, list(nodes))]).clone()
            else:
                root = self._tree_across_ranks(nodes, held, labels, num_blocks, key, tag, n)
        self.wait_s[tag] += time.perf_counter() - t0
        return root

    def _tree_across_ranks(
        self,
        nodes: torch.Tensor,
        held: Sequence[Label],
        labels: list[Label],
        num_blocks: int,
        key: str,
        tag: str,
        n: int,
    ) -> torch.Tensor:
        """:meth:`tree_sum_` over ``size > 1`` ranks; ``held`` is the caller's labels object.

        The ranks' intervals are gathered once per ``key`` and labels object: a new object (a
        new layout, e.g. the next trainer on this communicator: every rank makes its own at
        the same call) gathers them again, on every rank alike; the cache keeps the object, so
        its identity cannot be taken by another while cached."""
        cached = self._tree_labels.get(key)
        if cached is None or cached[0] is not held:
            every = [list(map(tuple, ls)) for ls in self._allgather_object(labels)]
            cached = self._tree_labels[key] = (held, every)
        every = cached[1]
        counts = chunk_sizes(n, self.size)
        offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
        mine = counts[self.rank]
        local = nodes.detach().to(self.device)
        send = torch.cat(
            [local[:, offsets[q] : offsets[q + 1]].reshape(-1) for q in range(self.size)]
        )
        sizes = [len(ls) for ls in every]
        recv = _empty_like_rows(send, sum(sizes) * mine)
        self._alltoallv(send, recv, [len(labels) * c for c in counts], [k * mine for k in sizes])()
        pieces, at = [], 0
        for ls in every:
            pieces.append((ls, [recv[at + j * mine : at + (j + 1) * mine] for j in range(len(ls))]))
            at += len(ls) * mine
        chunk = combine(num_blocks, pieces)
        flat = _empty_like_rows(send, n)
        self._alltoallv(chunk.repeat(self.size), flat, [mine] * self.size, counts)()
        self.bytes_sent[tag] += (len(labels) * (n - mine) + (self.size - 1) * mine) * (
            flat.element_size()
        )
        return flat

    def broadcast_(self, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` on every rank with rank ``root``'s values."""
        with self._peer_failures("broadcast"):
            self._broadcast(tensor, root)
        return tensor

    def barrier(self) -> None:
        """Wait until every rank arrives (a one-element reduction, so it has a timeout)."""
        with self._peer_failures("barrier"):
            self._allreduce(torch.zeros(1, device=self.device), "sum")


def chunk_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous chunks of ``n`` elements; the first ``n % parts`` are longer.

    Args:
        n: number of elements (>= 0).
        parts: number of chunks (>= 1).

    Returns:
        ``parts`` sizes summing to ``n`` (some are 0 when ``n < parts``).
    """
    base, extra = divmod(int(n), int(parts))
    return [base + (1 if r < extra else 0) for r in range(parts)]


def ordered_sum(pieces: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of the rows of ``pieces`` added left to right: ``((p_0 + p_1) + p_2) + ...``.

    Every element is rounded after each addition in ``pieces``' dtype, so the result does not
    depend on the device or on how torch would vectorise a ``sum(dim=0)``.

    Args:
        pieces: the contributions in rank order, [P, m].
        out: where to write the sum, [m] (may be ``pieces[0]`` itself, but no other row);
            a new tensor when ``None``.

    Returns:
        The sum, [m], of ``pieces``' dtype and device (``out`` when given).
    """
    out = pieces[0].clone() if out is None else out.copy_(pieces[0])
    for q in range(1, pieces.shape[0]):
        out.add_(pieces[q])
    return out


def _empty_like_rows(send: torch.Tensor, rows: int) -> torch.Tensor:
    """An uninitialised ``[rows, *send.shape[1:]]`` buffer on ``send``'s device.

    On the CPU it comes from numpy, whose allocator maps large buffers with huge pages: filling
    a fresh 36 MB torch allocation cost 2-3x more (page faults) in our measurements.
    """
    shape = (rows, *send.shape[1:])
    if send.device.type == "cpu" and send.dtype in (torch.float32, torch.float64, torch.uint8):
        return torch.from_numpy(np.empty(shape, dtype=send.detach().numpy().dtype))
    return torch.empty(shape, dtype=send.dtype, device=send.device)
