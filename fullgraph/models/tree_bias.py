"""``out + b`` whose bias gradient goes into the step's block tree: the row sums of ``dOut`` per
block (:meth:`~fullgraph.distributed.tree_sum.BlockGradients.add`), added in the tree's fixed
order, the same bits at any rank count. For a bias added on its own (GAT's, after the attention),
where no :func:`~fullgraph.models.mixed_linear.mixed_linear` product carries it."""

from __future__ import annotations

from typing import Any

import torch

from fullgraph.distributed.tree_sum import BlockGradients, active_gradients, row_sum


class TreeBiasFunction(torch.autograd.Function):
    """``out + bias``; the backward passes ``dOut`` on and pushes its per-block row sums."""

    @staticmethod
    def forward(
        ctx: Any, out: torch.Tensor, bias: torch.Tensor, tree: BlockGradients
    ) -> torch.Tensor:
        """``out + bias`` (a new tensor)."""
        ctx.tree, ctx.bias = tree, bias
        return out + bias

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """``dOut`` for ``out``; the bias's partials into the tree (no gradient returned)."""
        if ctx.needs_input_grad[1]:
            ctx.tree.add(ctx.bias, row_sum, dy.contiguous())
        return dy, None, None


def tree_bias(out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``out + bias``: inside a training step whose block tree is in force, a leaf ``bias``
    added to every inner row takes :class:`TreeBiasFunction` (the same forward bits).

    Args:
        out: float32 [n, out].
        bias: float32 [out].

    Returns:
        float32 [n, out].
    """
    tree = active_gradients()
    if tree is not None and tree.handles(bias, int(out.shape[0])):
        return TreeBiasFunction.apply(out, bias, tree)
    return out + bias
