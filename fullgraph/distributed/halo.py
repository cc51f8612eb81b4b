"""Halo exchange: fill halo rows from their owners, return halo gradients to them.

Each rank's local rows are its inner nodes followed by halo nodes grouped by owner rank. For
peer ``q`` the rank sends ``h[send_index[send_offsets[q]:send_offsets[q+1]]]`` and receives the
halo rows ``recv_offsets[q]:recv_offsets[q+1]`` (in the order ``q`` sends them).

- :class:`HaloExchange` (autograd): forward returns the halo rows; backward sends the halo-row
  gradients back to their owners, who sum them into their inner rows with ``index_add``.
- :class:`HaloAggregate` (autograd): ``Y = A_inner @ H + A_halo @ H_halo`` with the exchange in
  flight while ``A_inner @ H`` runs, and the reverse exchange in flight while ``A_inner^T @ dY``
  runs in the backward pass.

Compression (:mod:`fullgraph.distributed.compression`): when the plan carries a
:class:`HaloCompression`, the exchanges of a training step (inside
:meth:`HaloPlan.training_step`) send one byte buffer per peer (packed codes and per-row
parameters together, counts in bytes) and the receiver decodes it; outside a step
(evaluation, the precomputed first aggregation) rows go as float32. The forward quantization
passes gradients straight through; the backward exchange compresses the gradients themselves.

Precision (``--precision bf16-mixed``: the plan's :class:`~fullgraph.precision.Precision`,
given at construction; :attr:`HaloPlan.row_dtype`): an aggregation reads its
input rows in bfloat16 and sums them in float64, where those sums are exact: a row's terms
(inner ones first, then each slice of halo ones) give, rounded once to float32, what one
process gets adding them in its own order. Forward halo rows travel in bfloat16 (half the
bytes, and nothing lost: every rank, and one process, rounds them alike before use). The
backward exchange carries partial sums ``A_halo^T dY`` of the float32 backward pass, which
one process never rounds, so it stays float32 (``--compress-bwd bf16`` halves it at the cost
of that rounding).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fullgraph.distributed import exchange_slices as slicing
from fullgraph.distributed.communicator import Communicator, PendingExchange
from fullgraph.distributed.compression import BACKWARD, FORWARD, HaloCompression, record_bytes
from fullgraph.distributed.exchange_slices import ExchangeSlice
from fullgraph.distributed.halo_overlap import aggregate_rows, exchange_halo_gradients
from fullgraph.kernels import CSRMatrix, spmm, spmm_add_
from fullgraph.precision import FLOAT32, Precision

if TYPE_CHECKING:
    from fullgraph.partition import Partition


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
        overlap: run the inner aggregation while the exchange is in flight (``False``: every
            exchange completes before it is handed back; benchmarks use it to measure what the
            overlap hides).
        compression: codecs and error-feedback state of training exchanges, or ``None``.
        max_rows: the most rows any rank sends or receives in one exchange (the same on every
            rank: it sets how many slices a wide exchange goes in).
        buffer_bytes: the largest send or receive buffer an uncompressed exchange may use; a
            larger one goes in slices (:mod:`fullgraph.distributed.exchange_slices`). Same on
            every rank.
        precision: the run's precision policy (:class:`~fullgraph.precision.Precision`;
            :attr:`row_dtype` is its compute dtype). Same on every rank.
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
    buffer_bytes: int = slicing.DEFAULT_BUFFER_BYTES
    precision: Precision = FLOAT32
    _slices: dict[int, list[ExchangeSlice]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_partition(
        cls,
        part: Partition,
        comm: Communicator,
        *,
        buffer_bytes: int = slicing.DEFAULT_BUFFER_BYTES,
        compression: HaloCompression | None = None,
        precision: Precision = FLOAT32,
    ) -> HaloPlan:
        """Build the plan from a partition's ``send_index``/``send_offsets``/``recv_offsets``.

        A collective: every rank calls it (the largest exchange is agreed on by all-reduce).

        Args:
            part: the rank's part.
            comm: the communicator.
            buffer_bytes: see :attr:`buffer_bytes` (the same on every rank).
            compression: codecs of the training exchanges, or ``None``.
            precision: the run's precision policy.
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
            buffer_bytes=int(buffer_bytes),
            compression=compression,
            precision=precision,
        )

    @property
    def row_dtype(self) -> torch.dtype | None:
        """The dtype aggregations and weight products read their rows in (``torch.bfloat16``
        under ``bf16-mixed``: their forward halo rows are sent so), or ``None``: the rows'
        own (:attr:`Precision.compute_dtype <fullgraph.precision.Precision.compute_dtype>`)."""
        return self.precision.compute_dtype

    def with_precision(self, precision: Precision) -> HaloPlan:
        """This plan at another precision: a new plan sharing the maps (no collective)."""
        return dataclasses.replace(self, precision=precision)

    def slices(
        self, width: int, key: tuple[int, int] | None, direction: int
    ) -> list[ExchangeSlice | None]:
        """The slices an exchange of ``width`` columns goes in (``[None]``: whole).

        Uncompressed exchanges whose largest buffer over all ranks exceeds
        :attr:`buffer_bytes` go in slices of every peer's rows
        (:mod:`fullgraph.distributed.exchange_slices`); compressed ones (4-16x smaller) go whole.
        """
        comp = self.compression
        if comp is not None and comp.active(key, direction):
            return [None]
        count = slicing.slice_count(self.max_rows, width, self.buffer_bytes)
        if count == 1:
            return [None]
        if count not in self._slices:
            self._slices[count] = slicing.exchange_slices(
                self.send_index, self.send_counts, self.recv_counts, count
            )
        return list(self._slices[count])

    @contextlib.contextmanager
    def training_step(self, epoch: int) -> Iterator[None]:
        """Compress the exchanges of one training step of ``epoch`` (no-op without codecs)."""
        if self.compression is None:
            yield
            return
        with self.compression.step(epoch):
            yield

    def rows_in(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` in :attr:`row_dtype` (itself when that is ``None`` or already its dtype)."""
        return h if self.row_dtype is None else h.to(self.row_dtype)

    def next_key(self) -> tuple[int, int] | None:
        """``(epoch, exchange)`` of the next forward exchange in a step, else ``None``."""
        return None if self.compression is None else self.compression.next_key()

    def _parts(self, piece: ExchangeSlice | None) -> tuple[torch.Tensor, list[int], list[int]]:
        if piece is None:
            return self.send_index, self.send_counts, self.recv_counts
        return piece.send_index, piece.send_counts, piece.recv_counts

    def start_forward(
        self,
        h_inner: torch.Tensor,
        key: tuple[int, int] | None = None,
        piece: ExchangeSlice | None = None,
    ) -> PendingExchange | DecodingExchange:
        """Send boundary rows of ``h_inner``; the result's ``wait()`` gives the halo rows.

        Args:
            h_inner: rows of the inner nodes, float [num_inner, W].
            key: ``(epoch, exchange)`` from :meth:`next_key`: compress as configured; ``None``
                sends float32.
            piece: one slice of the exchange (:meth:`slices`), or ``None`` for all of it.
        """
        index, send_counts, recv_counts = self._parts(piece)
        send = h_inner.index_select(0, index.to(h_inner.device))
        return self._start(send, send_counts, recv_counts, key, FORWARD)

    def start_backward(
        self,
        grad_halo: torch.Tensor,
        key: tuple[int, int] | None = None,
        piece: ExchangeSlice | None = None,
    ) -> PendingExchange | DecodingExchange:
        """Send halo-row gradients back to their owners; ``wait()`` gives rows to sum."""
        _, send_counts, recv_counts = self._parts(piece)
        return self._start(grad_halo, recv_counts, send_counts, key, BACKWARD)

    def _start(
        self,
        rows: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        key: tuple[int, int] | None,
        direction: int,
    ) -> PendingExchange | DecodingExchange:
        comp = self.compression
        exchange: PendingExchange | DecodingExchange
        if comp is None or not comp.active(key, direction):
            exchange = self.comm.alltoallv_start(rows, send_counts, recv_counts, tag="halo")
        else:
            width = int(rows.shape[1])
            rec = record_bytes(comp.codecs[direction], width)
            buf = comp.encode(rows, key, direction)
            pending = self.comm.alltoallv_start(
                buf, [c * rec for c in send_counts], [c * rec for c in recv_counts], tag="halo"
            )
            num_rows = sum(recv_counts)
            exchange = DecodingExchange(
                pending, lambda b: comp.decode(b, num_rows, width, direction)
            )
        if not self.overlap:
            exchange.wait()  # nothing runs while it is in flight
        return exchange

    def inner_rows(self, piece: ExchangeSlice | None = None) -> torch.Tensor:
        """Local inner ids of the rows sent in slice ``piece`` (all of them for ``None``),
        grouped by peer: where the gradients returned for them are summed."""
        return self._parts(piece)[0]

    def scatter_back(
        self,
        grad_inner: torch.Tensor,
        received: torch.Tensor,
        piece: ExchangeSlice | None = None,
    ) -> torch.Tensor:
        """Sum received halo gradients (of slice ``piece``) into their owners' rows."""
        if received.shape[0]:
            index = self._parts(piece)[0]
            grad_inner.index_add_(0, index.to(grad_inner.device), received)
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
    def forward(
        ctx: Any, h_inner: torch.Tensor, plan: HaloPlan, send_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Return the halo rows, float [num_halo, W] in ``h_inner``'s dtype, received from
        their owners; ``send_dtype`` (bf16-mixed: the plan's ``row_dtype``, when the receiver
        rounds the rows to it anyway) is the dtype they travel in."""
        ctx.plan = plan
        ctx.num_inner = h_inner.shape[0]
        ctx.key = plan.next_key()
        send = h_inner if send_dtype is None else h_inner.to(send_dtype)
        return plan.start_forward(send, ctx.key).wait().to(h_inner.dtype)

    @staticmethod
    def backward(ctx: Any, grad_halo: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        """Send halo gradients to their owners; owners sum them into inner-row gradients."""
        plan: HaloPlan = ctx.plan
        received = plan.start_backward(grad_halo.contiguous(), ctx.key).wait()
        grad = grad_halo.new_zeros((ctx.num_inner, grad_halo.shape[1]))
        return plan.scatter_back(grad, received), None, None


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
        self._pieces: dict[tuple[int, int], tuple[torch.Tensor, CSRMatrix, CSRMatrix]] = {}
        self._slots: tuple[torch.Tensor, torch.Tensor, CSRMatrix | None] | None = None

    def halo_slots(self) -> tuple[torch.Tensor, torch.Tensor, CSRMatrix | None]:
        """``(rows, slot, compact)``: the inner rows with halo entries (ascending), each inner
        row's index among them (``-1`` for the others), and the halo block of those rows only
        (``None`` without halo); built on first use, kept. An exact bf16 aggregation keeps
        those rows' sums in float64 until their halo terms are in."""
        if self._slots is None:
            n = self.inner.num_rows
            slot = torch.full((n,), -1, dtype=torch.int64, device=self.inner.device)
            if self.halo is None:
                rows = torch.zeros(0, dtype=torch.int64, device=self.inner.device)
                compact = None
            else:
                rows, compact = self.halo.without_empty_rows()
                slot[rows] = torch.arange(rows.numel(), device=slot.device)
            self._slots = (rows, slot, compact)
        return self._slots

    def _piece(self, piece: ExchangeSlice) -> tuple[torch.Tensor, CSRMatrix, CSRMatrix]:
        """Slice ``piece``'s halo columns: the inner rows they reach, those rows' block, and
        the block's transpose (built on first use, kept; nothing of ``num_inner`` rows)."""
        key = (piece.count, piece.index)
        if key not in self._pieces:
            assert self.halo is not None
            block = self.halo.select_columns(piece.halo_rows.to(self.halo.device))
            rows, compact = block.without_empty_rows()
            self._pieces[key] = (rows, compact, block.transposed())
        return self._pieces[key]

    def halo_transpose(self, piece: ExchangeSlice | None) -> CSRMatrix | None:
        """``A_halo^T`` restricted to the halo rows slice ``piece`` brings (all for ``None``):
        rows = those halo rows, columns = inner rows."""
        if self.halo is None:
            return None
        if piece is None:
            return self.halo_t
        return self._piece(piece)[2]

    def add_halo_product(
        self, y: torch.Tensor, halo: torch.Tensor, piece: ExchangeSlice | None = None
    ) -> torch.Tensor:
        """``y += A_halo @ halo`` in place (:func:`~fullgraph.kernels.spmm_add_`: no
        temporary on the CPU, row blocks of at most 8 MB elsewhere).

        Args:
            y: the inner product, float [num_inner, W] (modified).
            halo: the halo rows (of slice ``piece``), float [rows, W].
            piece: the slice ``halo`` holds, or ``None`` for all halo rows.

        Returns:
            ``y``.
        """
        if self.halo is None or halo.shape[0] == 0:
            return y
        if piece is None:
            return spmm_add_(y, self.halo, halo)
        rows, compact, _ = self._piece(piece)
        return spmm_add_(y, compact, halo, rows.to(y.device))

    def add_halo_partial(
        self, partial: torch.Tensor, halo: torch.Tensor, piece: ExchangeSlice | None = None
    ) -> torch.Tensor:
        """``partial += A_halo @ halo`` over the rows of :meth:`halo_slots` only (``partial``
        float64 [len(rows), W], ``halo`` bfloat16): the halo terms of an exact aggregation."""
        if self.halo is None or halo.shape[0] == 0:
            return partial
        _, slot, compact = self.halo_slots()
        if piece is None:
            assert compact is not None
            return spmm_add_(partial, compact, halo)
        rows, block, _ = self._piece(piece)
        return spmm_add_(partial, block, halo, slot[rows.to(slot.device)])


class HaloAggregate(torch.autograd.Function):
    """``Y = A_inner @ H + A_halo @ halo(H)``, overlapping the exchange with the inner part.

    A wide exchange goes in slices (:meth:`HaloPlan.slices`): the next slice is in flight
    while the halo product of the current one is added (:func:`aggregate_rows`).
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, op: SplitOperator, plan: HaloPlan) -> torch.Tensor:
        """Aggregate over inner and halo neighbours.

        Shapes:
            - ``h``: [num_inner, W] -> [num_inner, W].
        """
        ctx.op, ctx.plan = op, plan
        ctx.key = None if plan.comm.size == 1 else plan.next_key()
        return aggregate_rows(h, op, plan, ctx.key)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        """Send ``A_halo^T dY`` to the owners while ``A_inner^T dY`` runs; owners sum."""
        op: SplitOperator = ctx.op
        grad_y = grad_y.contiguous()
        out: list[torch.Tensor] = []

        def inner() -> None:
            out.append(spmm(op.inner_t, grad_y))

        def receive(rows: torch.Tensor, index: torch.Tensor) -> None:
            out[0].index_add_(0, index, rows)

        exchange_halo_gradients(grad_y, op, ctx.plan, ctx.key, inner, receive)
        return out[0], None, None
