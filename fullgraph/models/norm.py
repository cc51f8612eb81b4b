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
``torch.nn.LayerNorm``): local to a rank, exact by construction.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

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


class _GraphBatchNormFunction(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with moments over every rank's rows.

    Forward: the global moments, then torch's fused inference-mode ``batch_norm`` with them.
    Backward: torch's fused inference-mode backward gives ``dy * weight * invstd`` and this
    rank's ``sum dy`` and ``sum dy * x_hat`` (the bias and weight gradients) in one pass; the
    input gradient's batch terms need those two sums over ALL rows, one all-reduce, and then
    ``dx -= a + x * b`` (per-column ``a``, ``b``) in place. Saved: the input and the moments.
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
        mean_x, var_x, count = global_moments(x, comm)
        ctx.comm, ctx.count, ctx.eps = comm, count, eps
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


class NodeLayerNorm(nn.LayerNorm):
    """LayerNorm of every node's row on its own (PyG ``LayerNorm(mode="node")``)."""

    def forward(self, x: torch.Tensor, comm: Any = None) -> torch.Tensor:
        """Normalise each row of ``x``; ``comm`` is accepted for a uniform call and unused."""
        return super().forward(x)


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
