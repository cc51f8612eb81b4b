"""Normalisation between layers, exact across ranks: BatchNorm over all nodes, LayerNorm per node.

``--norm batch`` is PyG's ``BatchNorm`` (``torch.nn.BatchNorm1d``) applied to the whole node
matrix: the mean and the (biased) variance of every feature are taken over ALL nodes of the
graph, so a rank cannot compute them alone. :class:`GraphBatchNorm` all-reduces them (two
passes: the sums of ``x``, then of ``(x - mean)^2``, for the same accuracy as one process), and
its backward all-reduces the two sums the input gradient needs (``sum dy`` and
``sum dy * x_hat``, which are also the bias and weight gradients), so P ranks compute what one
process computes. The elementwise work is torch's fused inference-mode kernels fed with the
global moments (about 2x torch's own ``BatchNorm1d`` per step on CPU, against 4x for plain
tensor expressions). Running statistics (momentum
0.1, unbiased variance, as torch) serve evaluation and travel in the model's ``state_dict``,
hence in checkpoints.

``--norm layer`` normalises every node's row on its own (PyG ``LayerNorm(mode="node")``,
``torch.nn.LayerNorm``): local to a rank, exact by construction; only its weight and bias
gradients are sums over rows.

Inside a training step whose block tree is in force (the part has fixed node blocks:
:mod:`fullgraph.distributed.tree_sum`) these sums over nodes are per-block float64 partials
added in the block tree instead (:func:`~fullgraph.distributed.tree_sum.tree_root`), so they
are the same bits at any rank count: BatchNorm's moments (the row count rides along), its
backward's two column sums, whose roots are also its weight and bias gradients
(:meth:`~fullgraph.distributed.tree_sum.BlockGradients.add_global`: not summed again), and
LayerNorm's weight and bias gradients (per-block partials the step's tree adds,
:meth:`~fullgraph.distributed.tree_sum.BlockGradients.add`). The running statistics follow
from the moments, so they are the same bits at any rank count too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fullgraph.distributed.tree_sum import BlockGradients, active_gradients, row_sum, tree_root
from fullgraph.errors import ConfigError

NORMS = ("none", "batch", "layer")


def global_moments(x: torch.Tensor, comm: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mean and biased variance of every column over all ranks' rows, and the row count.

    Two passes, as one process would take them: the column sums (and row counts) all-reduced
    give the mean; then the sums of squared deviations from it, all-reduced, the variance.
    Sums are accumulated and travel in float64; the squares are formed in place (one temporary).
    """
    n_local = torch.tensor([float(x.shape[0])], dtype=torch.float64)
    sums = torch.cat([x.sum(dim=0, dtype=torch.float64).cpu(), n_local]).to(comm.device)
    comm.allreduce_(sums, "sum", tag="norm")
    count = float(sums[-1])
    mean = (sums[:-1] / count).to(device=x.device, dtype=x.dtype)
    sq = (x - mean).square_().sum(dim=0, dtype=torch.float64).to(comm.device)
    comm.allreduce_(sq, "sum", tag="norm")
    var = (sq / count).to(device=x.device, dtype=x.dtype)
    return mean, var, count


def norm_tree(rows: int, *params: torch.Tensor | None) -> BlockGradients | None:
    """The step's block tree when a norm over ``rows`` rows sums through it: a tree in force,
    ``rows`` every inner row of the part, and each of ``params`` a leaf the tree takes or one
    that wants no gradient (else ``None``: the rank-order sums)."""
    tree = active_gradients()
    if tree is None or rows != tree.layout.num_rows:
        return None
    if any(p is not None and p.requires_grad and not tree.handles(p, rows) for p in params):
        return None
    return tree


def add_global_grads(tree: BlockGradients, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Give each ``(param, root)``'s ``param`` the tree-summed gradient ``root`` (in the
    parameter's dtype and device), where it wants one."""
    for param, root in pairs:
        if param.requires_grad:
            tree.add_global(param, root.to(device=param.device, dtype=param.dtype))


def _column_sums_with_count(rows: torch.Tensor) -> torch.Tensor:
    """A block's column sums in float64 and its row count: [width + 1]."""
    count = torch.full((1,), float(rows.shape[0]), dtype=torch.float64, device=rows.device)
    return torch.cat([rows.sum(dim=0, dtype=torch.float64), count])


def tree_moments(
    x: torch.Tensor, comm: Any, tree: BlockGradients
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """:func:`global_moments` over the block tree: the same two passes, every sum per block
    in float64 and the blocks added in the tree (the same bits at any rank count)."""
    layout = tree.layout
    sums = tree_root(comm, layout, layout.partials(_column_sums_with_count, x), "bn-moments")
    count = float(sums[-1])
    mean = (sums[:-1] / count).to(device=x.device, dtype=x.dtype)

    def squares(rows: torch.Tensor) -> torch.Tensor:
        return (rows - mean).square_().sum(dim=0, dtype=torch.float64)

    sq = tree_root(comm, layout, layout.partials(squares, x), "bn-moments")
    var = (sq / count).to(device=x.device, dtype=x.dtype)
    return mean, var, count


class _GraphBatchNormFunction(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with moments over every rank's rows.

    Forward: the global moments, then torch's fused inference-mode ``batch_norm`` with them.
    Backward: torch's fused inference-mode backward gives ``dy * weight * invstd`` and this
    rank's ``sum dy`` and ``sum dy * x_hat`` (the bias and weight gradients) in one pass; the
    input gradient's batch terms need those two sums over ALL rows, one all-reduce, and then
    ``dx -= a + x * b`` (per-column ``a``, ``b``) in place. Saved: the input and the moments.
    With the step's block tree (:func:`norm_tree`) the moments and the two sums are its roots
    (:func:`tree_moments`; per-block ``sum dy`` and ``sum dy (x - mean)``), and the weight and
    bias gradients go to the tree as roots (autograd gets ``None`` for them).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        comm: Any,
        eps: float,
        stats_out: list,
    ) -> torch.Tensor:
        """Normalise with global moments; ``stats_out`` receives ``(mean, var, count)``."""
        tree = norm_tree(int(x.shape[0]), weight, bias)
        if tree is None:
            mean_x, var_x, count = global_moments(x, comm)
        else:
            mean_x, var_x, count = tree_moments(x, comm, tree)
        ctx.comm, ctx.count, ctx.eps, ctx.tree, ctx.bias = comm, count, eps, tree, bias
        ctx.save_for_backward(x, mean_x, var_x, weight)
        stats_out.append((mean_x, var_x, count))
        return torch.nn.functional.batch_norm(
            x, mean_x, var_x, weight, bias, training=False, momentum=0.0, eps=eps
        )

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """Input gradient from the global sums of ``dy`` and ``dy * x_hat``."""
        x, mean, var, weight = ctx.saved_tensors
        comm, count = ctx.comm, ctx.count
        if ctx.tree is not None:
            return _tree_backward(ctx, dy.contiguous(), x, mean, var, weight)
        dx, d_weight, d_bias = torch.ops.aten.native_batch_norm_backward(
            dy.contiguous(), x, weight, mean, var, None, None, False, ctx.eps, [True, True, True]
        )
        sums = torch.cat([d_bias, d_weight]).double().to(comm.device)
        comm.allreduce_(sums, "sum", tag="norm")
        width = x.shape[1]
        s_bias = sums[:width].to(device=dy.device)
        s_weight = sums[width:].to(device=dy.device)
        # dx = invstd w (dy - (s_bias + x_hat s_weight) / count), x_hat = (x - mean) invstd:
        # the batch terms are a + x b with per-column a, b.
        invstd = torch.rsqrt(var.double() + ctx.eps)
        scale = invstd * weight.double() / count
        b = scale * invstd * s_weight
        a = scale * s_bias - b * mean.double()
        dx.sub_(a.to(dx.dtype)).addcmul_(x, b.to(dx.dtype), value=-1.0)
        return dx, d_weight, d_bias, None, None, None


def _tree_backward(
    ctx: Any,
    dy: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    weight: torch.Tensor,
) -> tuple:
    """:class:`_GraphBatchNormFunction`'s backward with the two sums over the block tree."""
    tree: BlockGradients = ctx.tree
    layout, count, width = tree.layout, ctx.count, x.shape[1]
    dx = torch.ops.aten.native_batch_norm_backward(
        dy, x, weight, mean, var, None, None, False, ctx.eps, [True, False, False]
    )[0]
    mean64 = mean.double()

    def sums(dy_b: torch.Tensor, x_b: torch.Tensor) -> torch.Tensor:
        centred = dy_b.double() * (x_b.double() - mean64)
        return torch.cat([dy_b.sum(dim=0, dtype=torch.float64), centred.sum(dim=0)])

    root = tree_root(ctx.comm, layout, layout.partials(sums, dy, x), "bn-grad").to(dy.device)
    invstd = torch.rsqrt(var.double() + ctx.eps)
    s_bias, s_weight = root[:width], root[width:] * invstd  # sum dy, sum dy x_hat
    scale = invstd * weight.double() / count
    b = scale * invstd * s_weight
    a = scale * s_bias - b * mean64
    dx.sub_(a.to(dx.dtype)).addcmul_(x, b.to(dx.dtype), value=-1.0)
    add_global_grads(tree, [(weight, s_weight), (ctx.bias, s_bias)])
    return dx, None, None, None, None, None


class GraphBatchNorm(nn.Module):
    """BatchNorm over all nodes of the graph, whichever rank holds them (PyG ``BatchNorm``).

    Args:
        width: number of features.
        eps: added to the variance.
        momentum: weight of the newest batch in the running statistics.

    Shapes:
        - input: [num_inner, width] -> [num_inner, width]
    """

    def __init__(self, width: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("running_var", torch.ones(width))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor, comm: Any) -> torch.Tensor:
        """Normalise ``x`` (this rank's rows); in training, with the moments of every rank's.

        Args:
            x: this rank's rows.
            comm: the job's communicator (a collective in training: every rank calls it).
        """
        if not self.training:
            return (x - self.running_mean) * torch.rsqrt(self.running_var + self.eps) * (
                self.weight
            ) + self.bias
        stats: list = []
        y = _GraphBatchNormFunction.apply(x, self.weight, self.bias, comm, self.eps, stats)
        self.update_running(*stats[0])
        return y

    @torch.no_grad()
    def update_running(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        """Fold one training step's global moments into the running statistics (as torch:
        momentum-weighted, the variance made unbiased with ``count / (count - 1)``)."""
        unbiased = var * (count / max(count - 1.0, 1.0))
        m = self.momentum
        self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
        self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        self.num_batches_tracked += 1


class _NodeLayerNormFunction(torch.autograd.Function):
    """``F.layer_norm`` whose weight and bias gradients go to the step's block tree.

    Backward: the input gradient as torch's own (``native_layer_norm_backward``, the same
    bits), and per block ``sum dy x_hat`` and ``sum dy`` pushed into the tree (autograd gets
    ``None`` for the weight and bias).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        shape: list[int],
        eps: float,
        tree: BlockGradients,
    ) -> torch.Tensor:
        """``F.layer_norm(x, shape, weight, bias, eps)``; keeps the rows' mean and rstd."""
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)
        ctx.shape, ctx.tree = shape, tree
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """Input gradient from torch; the weight and bias gradients as block partials."""
        x, mean, rstd, weight, bias = ctx.saved_tensors
        dy = dy.contiguous()
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.aten.native_layer_norm_backward(
                dy, x, ctx.shape, mean, rstd, weight, bias, [True, False, False]
            )[0]
        tree: BlockGradients = ctx.tree
        if ctx.needs_input_grad[1]:  # dy x_hat row by row (the same bits in any block), summed
            tree.add(weight, row_sum, dy * ((x - mean) * rstd))
        if ctx.needs_input_grad[2]:
            tree.add(bias, row_sum, dy)
        return dx, None, None, None, None, None


class NodeLayerNorm(nn.LayerNorm):
    """LayerNorm of every node's row on its own (PyG ``LayerNorm(mode="node")``).

    Inside a training step with a block tree (:func:`norm_tree`), the weight and bias
    gradients are its per-block partials (:class:`_NodeLayerNormFunction`); the output and
    the input gradient are torch's, the same bits.
    """

    def forward(self, x: torch.Tensor, comm: Any = None) -> torch.Tensor:
        """Normalise each row of ``x``; ``comm`` is accepted for a uniform call and unused."""
        tree = norm_tree(int(x.shape[0]), self.weight, self.bias)
        if tree is None or self.weight is None or self.bias is None or x.dim() != 2:
            return super().forward(x)
        shape = list(self.normalized_shape)
        return _NodeLayerNormFunction.apply(x, self.weight, self.bias, shape, self.eps, tree)


def make_norm(kind: str, width: int) -> nn.Module | None:
    """The normalisation of ``kind`` for ``width`` features, or ``None`` for ``none``.

    Raises:
        ConfigError: an unknown kind (the known ones listed).
    """
    if kind == "none":
        return None
    if kind == "batch":
        return GraphBatchNorm(width)
    if kind == "layer":
        return NodeLayerNorm(width)
    raise ConfigError(f"--norm must be one of {', '.join(NORMS)}, not {kind!r}")
