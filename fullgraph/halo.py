"""Halo exchange: fill halo rows from their owners, return halo gradients to them.

Each rank's local rows are its inner nodes followed by halo nodes grouped by owner rank. For
peer ``q`` the rank sends ``h[send_index[send_offsets[q]:send_offsets[q+1]]]`` and receives the
halo rows ``recv_offsets[q]:recv_offsets[q+1]`` (in the order ``q`` sends them).

- :class:`HaloExchange` (autograd): forward returns the halo rows; backward sends the halo-row
  gradients back to their owners, who sum them into their inner rows with ``index_add``.
- :class:`HaloAggregate` (autograd): ``Y = A_inner @ H + A_halo @ H_halo`` with the exchange in
  flight while ``A_inner @ H`` runs, and the reverse exchange in flight while ``A_inner^T @ dY``
  runs in the backward pass.

Compression (:mod:`fullgraph.compression`): when the plan carries a :class:`HaloCompression`,
the exchanges of a training step (inside :meth:`HaloPlan.training_step`) send one byte buffer
per peer (packed codes and per-row parameters together, counts in bytes) and the receiver
decodes it; outside a step (evaluation, the precomputed first aggregation) rows go as float32.
The forward quantization passes gradients straight through; the backward exchange compresses
the gradients themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fullgraph.comm import Communicator, PendingExchange
from fullgraph.compression import BACKWARD, FORWARD, HaloCompression, record_bytes
from fullgraph.kernels import CSRMatrix, spmm

#: Bytes of the largest send or receive buffer an uncompressed exchange may use at once; wider
#: exchanges are split into column chunks (:meth:`HaloPlan.column_chunks`).
EXCHANGE_CHUNK_BYTES = 16 << 20


@dataclass
class HaloPlan:
    """Who sends which rows to whom; built once per partition.

    Attributes:
        comm: the communicator.
        send_index: local inner ids sent, grouped by destination rank, int64 [S].
        send_counts: rows sent to each rank, list of P ints.
        recv_counts: halo rows received from each rank, list of P ints.
        num_inner: inner rows of this rank.
        num_halo: halo rows of this rank.
        overlap: run the inner aggregation while the exchange is in flight (``False`` waits
            first; benchmarks use it to measure what the overlap hides).
        compression: codecs and error-feedback state of training exchanges, or ``None``.
        max_rows: the most rows any rank sends or receives in one exchange (the same on every
            rank: it sets how many column chunks an exchange is split into).
    """

    comm: Communicator
    send_index: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    num_inner: int
    num_halo: int
    overlap: bool = True
    compression: HaloCompression | None = None
    max_rows: int = 0

    @classmethod
    def from_partition(cls, part: Any, comm: Communicator) -> HaloPlan:
        """Build the plan from a partition's ``send_index``/``send_offsets``/``recv_offsets``.

        A collective: every rank calls it (the largest exchange is agreed on by all-reduce).
        """
        send_counts = np.diff(np.asarray(part.send_offsets)).astype(int).tolist()
        recv_counts = np.diff(np.asarray(part.recv_offsets)).astype(int).tolist()
        rows = torch.tensor([float(max(sum(send_counts), sum(recv_counts)))], dtype=torch.float64)
        return cls(
            comm=comm,
            send_index=torch.from_numpy(np.array(part.send_index, dtype=np.int64)),
            send_counts=send_counts,
            recv_counts=recv_counts,
            num_inner=int(part.num_inner),
            num_halo=int(part.num_halo),
            max_rows=int(comm.allreduce_(rows, "max", tag="setup")[0]),
        )

    def column_chunks(
        self, width: int, key: tuple[int, int] | None, direction: int
    ) -> list[tuple[int, int]]:
        """Column ranges ``(start, stop)`` an exchange of ``width`` columns is sent in.

        Uncompressed exchanges whose largest buffer (over all ranks) exceeds
        :data:`EXCHANGE_CHUNK_BYTES` go in equal column chunks, at most two in flight, so that
        a rank holds two chunk-sized send and receive buffers instead of the whole exchange's.
        Compressed exchanges (already 4-16x smaller) go whole.
        """
        comp = self.compression
        if comp is not None and comp.active(key, direction):
            return [(0, width)]
        total = 4 * self.max_rows * width
        chunks = max(1, min(width, -(-total // EXCHANGE_CHUNK_BYTES)))
        step = -(-width // chunks)
        return [(c, min(c + step, width)) for c in range(0, width, step)]

    @contextlib.contextmanager
    def training_step(self, epoch: int) -> Iterator[None]:
        """Compress the exchanges of one training step of ``epoch`` (no-op without codecs)."""
        if self.compression is None:
            yield
            return
        with self.compression.step(epoch):
            yield

    def next_key(self) -> tuple[int, int] | None:
        """``(epoch, exchange)`` of the next forward exchange in a step, else ``None``."""
        return None if self.compression is None else self.compression.next_key()

    def start_forward(
        self, h_inner: torch.Tensor, key: tuple[int, int] | None = None
    ) -> PendingExchange | DecodingExchange:
        """Send boundary rows of ``h_inner``; the result's ``wait()`` gives the halo rows.

        Args:
            h_inner: rows of the inner nodes, float [num_inner, W].
            key: ``(epoch, exchange)`` from :meth:`next_key`: compress as configured; ``None``
                sends float32.
        """
        send = h_inner.index_select(0, self.send_index.to(h_inner.device))
        return self._start(send, self.send_counts, self.recv_counts, key, FORWARD)

    def start_backward(
        self, grad_halo: torch.Tensor, key: tuple[int, int] | None = None
    ) -> PendingExchange | DecodingExchange:
        """Send halo-row gradients back to their owners; ``wait()`` gives rows to sum."""
        return self._start(grad_halo, self.recv_counts, self.send_counts, key, BACKWARD)

    def _start(
        self,
        rows: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        key: tuple[int, int] | None,
        direction: int,
    ) -> PendingExchange | DecodingExchange:
        comp = self.compression
        if comp is None or not comp.active(key, direction):
            return self.comm.alltoallv_start(rows, send_counts, recv_counts, tag="halo")
        width = int(rows.shape[1])
        rec = record_bytes(comp.codecs[direction], width)
        buf = comp.encode(rows, key, direction)
        pending = self.comm.alltoallv_start(
            buf, [c * rec for c in send_counts], [c * rec for c in recv_counts], tag="halo"
        )
        num_rows = sum(recv_counts)
        return DecodingExchange(pending, lambda b: comp.decode(b, num_rows, width, direction))

    def scatter_back(self, grad_inner: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        """Sum received halo gradients into their owners' rows (``index_add_``)."""
        if received.shape[0]:
            grad_inner.index_add_(0, self.send_index.to(grad_inner.device), received)
        return grad_inner


class DecodingExchange:
    """A compressed exchange in flight; :meth:`wait` returns the decoded float32 rows.

    Args:
        pending: the byte all-to-all.
        decode_fn: turns the received bytes into rows.
    """

    def __init__(
        self, pending: PendingExchange, decode_fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self._pending: PendingExchange | None = pending
        self._decode = decode_fn
        self._rows: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        """Block until the bytes have landed; decode them (once)."""
        if self._rows is None:
            self._rows = self._decode(self._pending.wait())
            self._pending = None  # the received bytes are no longer needed
        return self._rows


class HaloExchange(torch.autograd.Function):
    """Autograd halo exchange: ``H_inner -> H_halo`` (blocking; see :class:`HaloAggregate`)."""

    @staticmethod
    def forward(ctx: Any, h_inner: torch.Tensor, plan: HaloPlan) -> torch.Tensor:
        """Return the halo rows, float [num_halo, W], received from their owners."""
        ctx.plan = plan
        ctx.num_inner = h_inner.shape[0]
        ctx.key = plan.next_key()
        return plan.start_forward(h_inner, ctx.key).wait()

    @staticmethod
    def backward(ctx: Any, grad_halo: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Send halo gradients to their owners; owners sum them into inner-row gradients."""
        plan: HaloPlan = ctx.plan
        received = plan.start_backward(grad_halo.contiguous(), ctx.key).wait()
        grad = grad_halo.new_zeros((ctx.num_inner, grad_halo.shape[1]))
        return plan.scatter_back(grad, received), None


#: Output elements of one row block of the halo product (8 MB of float32): the product is
#: added into the inner result a block at a time, so its temporary stays this small.
HALO_BLOCK_ELEMENTS = 1 << 21


@dataclass
class SplitOperator:
    """A local aggregation operator split by column block, with transposes for backward.

    Attributes:
        inner: rows = inner nodes, columns = inner nodes.
        halo: rows = inner nodes, columns = halo nodes (``None`` without halo).
    """

    inner: CSRMatrix
    halo: CSRMatrix | None

    def __post_init__(self) -> None:
        self.inner_t = self.inner.t()
        self.halo_t = self.halo.t() if self.halo is not None else None
        self._halo_blocks: dict[int, list[tuple[int, int, CSRMatrix]]] = {}

    def add_halo_product(self, y: torch.Tensor, halo: torch.Tensor) -> torch.Tensor:
        """``y += A_halo @ halo`` in place, one block of rows at a time.

        Args:
            y: the inner product, float [num_inner, W] (modified).
            halo: the halo rows, float [num_halo, W].

        Returns:
            ``y``.
        """
        if self.halo is None or halo.shape[0] == 0:
            return y
        width = int(halo.shape[1])
        blocks = self._halo_blocks.get(width)
        if blocks is None:
            blocks = self._halo_blocks[width] = _row_blocks(self.halo, width)
        for start, stop, block in blocks:
            y[start:stop] += spmm(block, halo)
        return y


def _row_blocks(a: CSRMatrix, width: int) -> list[tuple[int, int, CSRMatrix]]:
    """``a``'s non-empty row blocks whose product with ``width`` columns holds at most
    :data:`HALO_BLOCK_ELEMENTS` elements, as ``(start, stop, block)``."""
    step = max(1, HALO_BLOCK_ELEMENTS // max(width, 1))
    blocks = []
    for start in range(0, a.num_rows, step):
        stop = min(start + step, a.num_rows)
        block = a.row_block(start, stop)
        if block.nnz:
            blocks.append((start, stop, block))
    return blocks


class HaloAggregate(torch.autograd.Function):
    """``Y = A_inner @ H + A_halo @ halo(H)``, overlapping the exchange with the inner part.

    A wide exchange goes in column chunks (:meth:`HaloPlan.column_chunks`): the next chunk is
    in flight while the halo product of the current one is added.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, op: SplitOperator, plan: HaloPlan) -> torch.Tensor:
        """Aggregate over inner and halo neighbours.

        Shapes:
            - ``h``: [num_inner, W] -> [num_inner, W].
        """
        ctx.op, ctx.plan = op, plan
        distributed = plan.comm.size > 1
        ctx.key = plan.next_key() if distributed else None
        if not distributed:
            return spmm(op.inner, h)
        chunks = plan.column_chunks(int(h.shape[1]), ctx.key, FORWARD)

        def start(k: int) -> PendingExchange | DecodingExchange:
            lo, hi = chunks[k]
            pending = plan.start_forward(h if len(chunks) == 1 else h[:, lo:hi], ctx.key)
            if not plan.overlap:
                pending.wait()
            return pending

        pending = start(0)
        y = spmm(op.inner, h)
        for k, (lo, hi) in enumerate(chunks):
            following = start(k + 1) if k + 1 < len(chunks) else None
            halo = pending.wait()
            pending = following
            op.add_halo_product(y if len(chunks) == 1 else y[:, lo:hi], halo)
            del halo  # at most two chunks' buffers are alive at any time
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        """Send ``A_halo^T dY`` to the owners while ``A_inner^T dY`` runs; owners sum."""
        op: SplitOperator = ctx.op
        plan: HaloPlan = ctx.plan
        grad_y = grad_y.contiguous()
        if plan.comm.size == 1:
            return spmm(op.inner_t, grad_y), None, None
        chunks = plan.column_chunks(int(grad_y.shape[1]), ctx.key, BACKWARD)

        def start(k: int) -> PendingExchange | DecodingExchange:
            lo, hi = chunks[k]
            g = grad_y if len(chunks) == 1 else grad_y[:, lo:hi]
            rows = g.new_zeros((0, hi - lo)) if op.halo_t is None else spmm(op.halo_t, g)
            pending = plan.start_backward(rows, ctx.key)  # holds ``rows`` until they have left
            if not plan.overlap:
                pending.wait()
            return pending

        pending = start(0)
        grad_h = spmm(op.inner_t, grad_y)
        for k, (lo, hi) in enumerate(chunks):
            following = start(k + 1) if k + 1 < len(chunks) else None
            plan.scatter_back(grad_h if len(chunks) == 1 else grad_h[:, lo:hi], pending.wait())
            pending = following
        return grad_h, None, None
