"""``h W^T`` whose forward product runs in bfloat16 and whose backward runs in float32.

The products that are not a :func:`~fullgraph.models.graph_linear.graph_linear` body (GAT's
projection, GIN's second linear layer, the residual projections) under ``--precision
bf16-mixed``. ``torch.autocast`` would run the backward in bfloat16 too, rounding ``dY^T h``, a
sum over rows that P ranks split differently, and so make P ranks differ from one process; here
the backward is the float32 one (docs/train.md, "Precision"). ``dW`` is taken against the
bfloat16 input the product read (kept: half the bytes of ``h``): halo rows arrive rounded
already, and one process rounds its rows alike only there.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


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


def mixed_linear(
    h: torch.Tensor,
    weight: torch.Tensor,
    dtype: torch.dtype | None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``h W^T + b``: the product in ``dtype`` forward and float32 backward, or ``F.linear``
    when ``dtype`` is ``None``.

    Args:
        h: float32 [n, in].
        weight: float32 [out, in].
        dtype: the forward product's dtype (the plan's ``row_dtype``), or ``None``.
        bias: float32 [out] (added in float32), or ``None``.

    Returns:
        float32 [n, out].
    """
    if dtype is None:
        return F.linear(h, weight, bias)
    out = MixedLinearFunction.apply(h, weight, dtype)
    return out if bias is None else out + bias
