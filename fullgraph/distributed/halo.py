"""Halo exchange: fill halo rows from their owners, return halo gradients to them.

Each rank's local rows are its inner nodes followed by halo nodes grouped by owner rank. For
peer ``q`` the rank sends ``h[send_index[send_offsets[q]:send_offsets[q+1]]]`` and receives the
halo rows ``recv_offsets[q]:recv_offsets[q+1]`` (in the order ``q`` sends them).

- :class:`HaloExchange` (autograd): forward returns the halo rows; backward sends the halo-row
  gradients back to their owners, who sum them into their inner rows with ``index_add``.
- :class:`HaloAggregate` (autograd): ``Y = A [H; H_halo]`` with every row summed in ascending
  global id of its sources (:mod:`fullgraph.distributed.ordered`): the same bits at every rank
  count and in one process. The interior rows (no halo source) are computed while the
  exchange is in flight, the boundary rows in one pass once the halo rows have landed. The
  backward sends the ``dY`` rows of boundary rows to the owners of the columns they read
  (:class:`~fullgraph.distributed.ordered.ReversePlan`), and every owner sums ``A^T dY`` over
  all in-edges in ascending global id, its interior rows while the exchange is in flight.

Compression (:mod:`fullgraph.distributed.compression`): when the plan carries a
:class:`HaloCompression`, the exchanges of a training step (inside
:meth:`HaloPlan.training_step`) send one byte buffer per peer (packed codes and per-row
parameters together, counts in bytes) and the receiver decodes it; outside a step
(evaluation, the precomputed first aggregation) rows go as float32. The forward quantization
passes gradients straight through; the backward exchange compresses the gradients themselves.

Precision (``--precision bf16-mixed``: the plan's :class:`~fullgraph.precision.Precision`,
given at construction; :attr:`HaloPlan.row_dtype`): an aggregation reads its input rows in
bfloat16, and sums every row in float64 in the fixed order above, rounded once to float32.
Forward halo rows travel in bfloat16 (half the bytes, and nothing lost: every rank, and one
process, rounds them alike before use). The backward pass is float32; its exchange carries
``dY`` rows, which one process uses unrounded too, so it stays float32 (``--compress-bwd bf16``
halves it at the cost of that rounding).
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
from fullgraph.distributed.split_operator import SplitOperator
from fullgraph.errors import PartitionError, mark_replicated
from fullgraph.kernels import spmm
from fullgraph.kernels.spmm import spmm_ordered_
from fullgraph.partition.load import check_peer_counts, whole_ids
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
        global_ids: global id of every local node (inner, then halo), int64
            [num_inner + num_halo], or ``None``: the local ids are the global ones (one
            process). The order of every aggregation's sums.
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
    global_ids: torch.Tensor | None = None
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

        A collective: every rank calls it (the largest exchange is agreed on by all-reduce,
        and every part's counts of rows sent to and received from each peer checked against
        the peer's: :func:`~fullgraph.partition.load.check_peer_counts`).

        Args:
            part: the rank's part.
            comm: the communicator.
            buffer_bytes: see :attr:`buffer_bytes` (the same on every rank).
            compression: codecs of the training exchanges, or ``None``.
            precision: the run's precision policy.
        """
        send_counts = np.diff(np.asarray(part.send_offsets)).astype(int).tolist()
        recv_counts = np.diff(np.asarray(part.recv_offsets)).astype(int).tolist()
        if comm.size > 1:  # every rank sees every pair: the verdict is the same on each
            try:
                check_peer_counts(comm.allgather_object((send_counts, recv_counts)))
            except PartitionError as exc:
                raise mark_replicated(exc) from None
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
            global_ids=torch.from_numpy(np.array(whole_ids(part), dtype=np.int64)),
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
        return slicing.cached_slices(
            self._slices,
            self.send_index,
            self.send_counts,
            self.recv_counts,
            self.max_rows,
            width,
            self.buffer_bytes,
        )

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


def aggregate_rows(
    h: torch.Tensor,
    op: SplitOperator,
    plan: HaloPlan,
    key: tuple[int, int] | None,
    rows_dtype: bool = False,
) -> torch.Tensor:
    """``A [h; halo(h)]`` without autograd, every row summed in ascending global id of its
    sources (the same bits at every rank count), the exchange overlapped with the interior
    rows.

    A sliced exchange (:meth:`HaloPlan.slices`) has the next slice in flight while one lands;
    the slices land in one halo buffer, since a boundary row is summed in one pass.

    Args:
        h: rows of the inner nodes, float [num_inner, W].
        op: the split operator.
        plan: the exchange plan.
        key: the exchange's key from :meth:`HaloPlan.next_key` (``None``: float32).
        rows_dtype: return the rows' own dtype (bf16-mixed: bfloat16, each float32 sum
            rounded once more in the kernel, the bits of ``.to(torch.bfloat16)`` of the
            float32 result), not float32.

    Returns:
        A new tensor, float [num_inner, W] (float32 for 16-bit rows, summed in float64 on the
        CPU and rounded once; ``rows_dtype``: the rows' dtype).
    """
    h = plan.rows_in(h)
    split = op.ordered(plan.global_ids)
    dtype = h.dtype if rows_dtype else (accumulate_dtype(h.dtype) or h.dtype)
    y = torch.empty((split.num_rows, h.shape[1]), dtype=dtype, device=h.device)

    def interior() -> None:
        spmm_ordered_(y, split.interior, split.interior_rows, h)

    if plan.comm.size == 1:
        interior()
        halo = None
    else:
        pieces = plan.slices(int(h.shape[1]), key, FORWARD)
        halo = slicing.land(
            lambda piece: plan.start_forward(h, key, piece), pieces, plan.num_halo, interior
        )
        halo = plan.rows_in(halo)  # a compressed exchange decodes to float32: round it alike
    spmm_ordered_(y, split.boundary, split.boundary_rows, h, halo)
    return y


def aggregate_transpose(
    grad_y: torch.Tensor, op: SplitOperator, plan: HaloPlan, key: tuple[int, int] | None
) -> torch.Tensor:
    """``A^T dY`` over this rank's rows without autograd: every ``dH_j`` summed over ALL
    in-edges ``i -> j`` in ascending global id of ``i``, wherever ``i`` lives (the same bits at
    every rank count).

    The ``dY`` rows of this rank's boundary rows go to the owners of the columns they read
    (:class:`~fullgraph.distributed.ordered.ReversePlan`, built on the first call: a
    collective), in slices as the forward exchange; the interior rows of the transpose are
    summed while the exchange is in flight.

    Args:
        grad_y: the gradient of the aggregation's output, float [num_inner, W].
        op: the split operator.
        plan: the exchange plan.
        key: the forward exchange's key (selects the backward codec).

    Returns:
        A new tensor, [num_inner, W], ``grad_y``'s dtype.
    """
    grad_y = grad_y.contiguous()
    rev = op.reverse(
        plan.comm, plan.send_index, plan.send_counts, plan.recv_counts, plan.global_ids
    )
    split = rev.split
    # 16-bit rows: the kernel's float32 sums rounded to their dtype in place (no float32 copy)
    out = torch.empty((split.num_rows, grad_y.shape[1]), dtype=grad_y.dtype, device=grad_y.device)

    def interior() -> None:
        spmm_ordered_(out, split.interior, split.interior_rows, grad_y)

    received = None
    if plan.comm.size == 1:
        interior()
    else:
        comp = plan.compression
        whole = comp is not None and comp.active(key, BACKWARD)
        pieces = [None] if whole else rev.slices(int(grad_y.shape[1]), plan.buffer_bytes)

        def start(piece: ExchangeSlice | None) -> PendingExchange | DecodingExchange:
            index, sent, got = (
                (rev.send_index, rev.send_counts, rev.recv_counts)
                if piece is None
                else (piece.send_index, piece.send_counts, piece.recv_counts)
            )
            rows = grad_y.index_select(0, index.to(grad_y.device))
            return plan._start(rows, sent, got, key, BACKWARD)  # holds ``rows`` until sent

        received = slicing.land(start, pieces, sum(rev.recv_counts), interior).to(grad_y.dtype)
    spmm_ordered_(out, split.boundary, split.boundary_rows, grad_y, received)
    return out


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """``torch.float32`` for 16-bit rows (their sums stay float32), else ``None`` (their own)."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else None


def exchange_halo_gradients(
    grad_y: torch.Tensor,
    op: SplitOperator,
    plan: HaloPlan,
    key: tuple[int, int] | None,
    inner: Callable[[], None],
    receive: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """The reverse exchange of an aggregation: ``A_halo^T dY`` goes to the halo rows' owners.

    ``inner()`` runs while the first slice is in flight (the caller's ``A_inner^T dY`` work);
    then, slice by slice (the next one in flight), ``receive(rows, index)`` gets the gradient
    rows other ranks computed for this rank's inner rows ``index`` (int64; an index may
    repeat across calls, never within one). One process: ``inner()`` only.

    Args:
        grad_y: the gradient of the aggregation's output, float [num_inner, W], contiguous.
        op: the split operator.
        plan: the exchange plan.
        key: the forward exchange's key (selects the backward codec).
        inner: the work overlapped with the exchange.
        receive: consumes one slice's received rows.
    """
    if plan.comm.size == 1:
        inner()
        return
    pieces = plan.slices(int(grad_y.shape[1]), key, BACKWARD)

    def start(k: int) -> PendingExchange | DecodingExchange:
        a_t = op.halo_transpose(pieces[k])
        if a_t is None:
            rows = grad_y.new_zeros((0, grad_y.shape[1]))
        else:
            rows = spmm(a_t, grad_y, accumulate_dtype(grad_y.dtype))
        return plan.start_backward(rows, key, pieces[k])  # holds ``rows`` until sent

    pending: PendingExchange | DecodingExchange | None = start(0)
    inner()
    for k, piece in enumerate(pieces):
        following = start(k + 1) if k + 1 < len(pieces) else None
        assert pending is not None
        received = pending.wait()
        pending = following
        if received.shape[0]:
            receive(received, plan.inner_rows(piece).to(received.device))
        del received


class HaloAggregate(torch.autograd.Function):
    """``Y = A [H; halo(H)]``, every row summed in ascending global id of its sources, the
    exchange overlapped with the interior rows (:func:`aggregate_rows`); the backward is
    :func:`aggregate_transpose`."""

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
        """``A^T dY`` in ascending global id of the sources (:func:`aggregate_transpose`)."""
        return aggregate_transpose(grad_y, ctx.op, ctx.plan, ctx.key), None, None
