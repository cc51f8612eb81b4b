"""``h W^T`` whose forward product runs in bfloat16 (and whose backward, with the block tree, too).

The products that are not a :func:`~fullgraph.models.graph_linear.graph_linear` body (GAT's
projection, GIN's second linear layer, the residual projections) under ``--precision
bf16-mixed``. ``torch.autocast`` would run the backward in bfloat16 too, rounding ``dY^T h``, a
sum over rows that P ranks split differently, and so make P ranks differ from one process; here
the backward is the float32 one (docs/train.md, "Precision"), except where the block tree is
in force (:class:`BlockLinearFunction`): there ``dY W`` and each block's ``dY_b^T h_b`` are
bfloat16 products (the same bits for a row or a block at any rank count). ``dW`` is taken
against the bfloat16 input the product read (kept: half the bytes of ``h``): halo rows arrive
rounded already, and one process rounds its rows alike only there.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fullgraph.distributed.tree_sum import BlockGradients, active_gradients, row_sum
from fullgraph.kernels.block_product import block_product, row_product


class MixedLinearFunction(torch.autograd.Function):
    """``F.linear(h, W)`` computed in ``dtype``, returned as float32; float32 gradients."""

    @staticmethod
    def forward(
        ctx: Any, h: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The product in ``dtype`` (float32 accumulation in the kernel), widened."""
        h_in = h.to(dtype)
        ctx.save_for_backward(h_in, weight)
        return F.linear(h_in, weight.to(dtype)).float()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """``dh = dY W`` and ``dW = dY^T h`` (``h`` as the product read it), float32."""
        h_in, weight = ctx.saved_tensors
        dh = torch.mm(dy, weight) if ctx.needs_input_grad[0] else None
        dw = torch.mm(dy.t(), h_in.float()) if ctx.needs_input_grad[1] else None
        return dh, dw, None


def _block_product(dy_b: torch.Tensor, x_b: torch.Tensor) -> torch.Tensor:
    """One block's ``dY_b^T x_b``: a bfloat16 product widened to float32 (``dY_b`` bfloat16:
    the kernel's float32 sums rounded to bfloat16), else the product in ``dY_b``'s dtype
    (float32; float64 for a float64 model, as fullgraph.pyg's parity tests train)."""
    if dy_b.dtype == torch.bfloat16:
        return torch.mm(dy_b.t(), x_b.to(torch.bfloat16)).float()
    return block_product(dy_b, x_b)  # narrow outputs: the same bits at any thread count


class BlockLinearFunction(torch.autograd.Function):
    """``h W^T + b`` whose weight and bias gradients go into the step's block tree.

    The forward is today's product: ``F.linear`` in float32, or the ``dtype`` product of
    :class:`MixedLinearFunction` (bias added in float32 after it). The backward gives
    ``dh = dY W`` to autograd and pushes ``dY_b^T h_b`` and the row sums of ``dY_b`` of every
    block ``b`` into ``tree`` (:mod:`fullgraph.distributed.tree_sum`).
    """

    @staticmethod
    def forward(
        ctx: Any,
        h: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype | None,
        tree: BlockGradients,
        rows: bool = False,
    ) -> torch.Tensor:
        """The product as :func:`mixed_linear` computes it."""
        if dtype is None and rows:
            out = row_product(h, weight)
            out = out if bias is None else out + bias
            h_in = h
        elif dtype is None:
            out = F.linear(h, weight, bias)
            h_in = h
        else:
            h_in = h.to(dtype)
            out = F.linear(h_in, weight.to(dtype)).float()
            if bias is not None:
                out = out + bias
        ctx.save_for_backward(h_in, weight)
        ctx.tree, ctx.params, ctx.dtype, ctx.rows = tree, (weight, bias), dtype, rows
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """``dh = dY W``; weight and bias partials per block into the tree. With a
        ``dtype`` forward (bf16-mixed) the products read ``dY`` and ``W`` in it too (each
        row's and each block's the same bits at any rank count); bias sums stay float32."""
        h_in, weight = ctx.saved_tensors
        tree: BlockGradients = ctx.tree
        w_param, b_param = ctx.params
        dy = dy.contiguous()
        n = int(dy.shape[0])
        low = ctx.dtype
        g = dy if low is None else dy.to(low)
        dh = None
        if ctx.needs_input_grad[0] and ctx.rows and low is None:
            dh = row_product(g, weight.t())
        elif ctx.needs_input_grad[0]:
            dh = torch.mm(g, weight if low is None else weight.to(low))
        dw = db = None
        dy_ordered = None  # float32 dY in block order, gathered once for the bias too
        if ctx.needs_input_grad[1]:
            if tree.handles(w_param, n):
                g_ordered = tree.layout.in_block_order(g)
                rows = tree.layout.in_block_order(h_in)
                tree.add(w_param, _block_product, g_ordered, rows, ordered=True)
                dy_ordered = g_ordered if low is None else None
            else:
                dw = torch.mm(dy.t(), h_in.to(dy.dtype))
        if b_param is not None and ctx.needs_input_grad[2]:
            if tree.handles(b_param, n):
                if dy_ordered is None:
                    tree.add(b_param, row_sum, dy)
                else:
                    tree.add(b_param, row_sum, dy_ordered, ordered=True)
            else:
                db = dy.sum(0)
        return dh, dw, db, None, None, None


def mixed_linear(
    h: torch.Tensor,
    weight: torch.Tensor,
    dtype: torch.dtype | None,
    bias: torch.Tensor | None = None,
    rows: bool = False,
) -> torch.Tensor:
    """``h W^T + b``: the product in ``dtype`` forward and float32 backward, or ``F.linear``
    when ``dtype`` is ``None``.

    Args:
        h: float32 [n, in].
        weight: float32 [out, in].
        dtype: the forward product's dtype (the plan's ``row_dtype``), or ``None``.
        bias: float32 [out] (added in float32), or ``None``.
        rows: every output row a fixed function of its input row alone, however many rows
            (:func:`~fullgraph.kernels.block_product.row_product`, forward and ``dY W``):
            for rows that are not a part's nodes (a link step's pairs, whose count per rank
            varies with the rank count in other ways).

    Inside a training step whose block tree is in force
    (:func:`~fullgraph.distributed.tree_sum.collecting`), a leaf ``weight`` applied to every
    inner row takes :class:`BlockLinearFunction`: the same forward, its gradients per block.

    Returns:
        float32 [n, out].
    """
    tree = active_gradients()
    if tree is not None and tree.handles(weight, int(h.shape[0])):
        return BlockLinearFunction.apply(h, weight, bias, dtype, tree, rows)
    if dtype is None and rows:
        out = row_product(h, weight)
        return out if bias is None else out + bias
    if dtype is None:
        return F.linear(h, weight, bias)
    out = MixedLinearFunction.apply(h, weight, dtype)
    return out if bias is None else out + bias
