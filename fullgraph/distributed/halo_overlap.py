"""The overlapped loops of a halo aggregation, without autograd: the forward
``A_inner @ h + A_halo @ halo(h)`` with each slice's exchange in flight while the previous
slice's product is added (:func:`aggregate_rows`; exact in float64 for bfloat16 rows), and the
reverse exchange of ``A_halo^T dY`` overlapped with the caller's inner work
(:func:`exchange_halo_gradients`). :class:`~fullgraph.distributed.halo.HaloAggregate` and the
layers that fuse their own products (:mod:`fullgraph.models.graph_linear`) run them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fullgraph.distributed.communicator import PendingExchange
from fullgraph.distributed.compression import BACKWARD, FORWARD
from fullgraph.distributed.exchange_slices import ExchangeSlice
from fullgraph.kernels import spmm, spmm_exact

if TYPE_CHECKING:
    from fullgraph.distributed.halo import DecodingExchange, HaloPlan, SplitOperator


def aggregate_rows(
    h: torch.Tensor, op: SplitOperator, plan: HaloPlan, key: tuple[int, int] | None
) -> torch.Tensor:
    """``A_inner @ h + A_halo @ halo(h)`` without autograd, the exchange overlapped.

    The exchange of slice ``k + 1`` is in flight while the halo product of slice ``k`` is
    added, so at most two slices' send and receive buffers are alive at once
    (:meth:`HaloPlan.slices`); each is released as soon as it is used.

    Args:
        h: rows of the inner nodes, float [num_inner, W].
        op: the split operator.
        plan: the exchange plan.
        key: the exchange's key from :meth:`HaloPlan.next_key` (``None``: float32).

    Returns:
        A new tensor, float [num_inner, W] (float32 for 16-bit rows, summed in float64).
    """
    h = plan.rows_in(h)
    if h.dtype == torch.bfloat16:
        return _aggregate_bf16(h, op, plan, key)
    if plan.comm.size == 1:
        return spmm(op.inner, h)
    return _overlapped(h, plan, key, lambda: spmm(op.inner, h), op.add_halo_product)


def _overlapped(
    h: torch.Tensor,
    plan: HaloPlan,
    key: tuple[int, int] | None,
    inner: Callable[[], torch.Tensor],
    add: Callable[[torch.Tensor, torch.Tensor, ExchangeSlice], object],
) -> torch.Tensor:
    """``y = inner()`` while the first slice of ``h``'s halo rows is in flight, then
    ``add(y, halo, slice)`` for every slice as it lands, the next one in flight meanwhile (at
    most two slices' buffers alive at any time); returns ``y``."""
    pieces = plan.slices(int(h.shape[1]), key, FORWARD)
    pending: PendingExchange | DecodingExchange | None = plan.start_forward(h, key, pieces[0])
    y = inner()
    for k, piece in enumerate(pieces):
        following = plan.start_forward(h, key, pieces[k + 1]) if k + 1 < len(pieces) else None
        assert pending is not None
        halo = pending.wait()
        pending = following
        add(y, halo, piece)
        del halo  # released before the next slice is received
    return y


def _aggregate_bf16(
    h: torch.Tensor, op: SplitOperator, plan: HaloPlan, key: tuple[int, int] | None
) -> torch.Tensor:
    """:func:`aggregate_rows` of bfloat16 rows, exact: every row summed in float64 and rounded
    once to float32 (:func:`~fullgraph.kernels.spmm_exact`); the rows with halo terms stay in
    float64 until those are in, so any order of a row's terms gives one process's result."""
    rows, slot, _ = op.halo_slots()
    partial = torch.empty((rows.numel(), h.shape[1]), dtype=torch.float64, device=h.device)
    if plan.comm.size == 1:
        return spmm_exact(op.inner, h, slot, partial)

    def add(y: torch.Tensor, halo: torch.Tensor, piece: ExchangeSlice) -> None:
        # a compressed exchange decodes to float32: round it as the sender's rows were
        op.add_halo_partial(partial, plan.rows_in(halo), piece)

    y = _overlapped(h, plan, key, lambda: spmm_exact(op.inner, h, slot, partial), add)
    if rows.numel():
        y.index_copy_(0, rows, partial.float())
    return y


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
