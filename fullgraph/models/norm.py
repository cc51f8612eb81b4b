"""Normalisation between layers, exact across ranks: BatchNorm over all nodes, LayerNorm per node.

``--norm batch`` is PyG's ``BatchNorm`` (``torch.nn.BatchNorm1d``) applied to the whole node
matrix: the mean and the (biased) variance of every feature are taken over ALL nodes of the
graph, so a rank cannot compute them alone. :class:`GraphBatchNorm` all-reduces them (two
passes: the sums of ``x``, then of ``(x - mean)^2``, for the same accuracy as one process), and
its backward all-reduces the two sums the input gradient needs (``sum dy`` and
``sum dy * x_hat``), so P ranks compute what one process computes. Running statistics (momentum
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


class _GraphBatchNormFunction(torch.autograd.Function):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with moments over every rank's rows."""

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
        n_local = torch.tensor([float(x.shape[0])], dtype=torch.float64)
        sums = torch.cat([x.sum(dim=0).double(), n_local]).to(comm.device)
        comm.allreduce_(sums, "sum", tag="norm")
        count = float(sums[-1])
        mean = (sums[:-1] / count).to(device=x.device, dtype=x.dtype)
        centred = x - mean
        sq = (centred * centred).sum(dim=0).double().to(comm.device)
        comm.allreduce_(sq, "sum", tag="norm")
        var = (sq / count).to(device=x.device, dtype=x.dtype)
        invstd = torch.rsqrt(var + eps)
        x_hat = centred * invstd
        ctx.comm, ctx.count = comm, count
        ctx.save_for_backward(x_hat, invstd, weight)
        stats_out.append((mean.detach(), var.detach(), count))
        return x_hat * weight + bias

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """Input gradient from the global sums of ``dy * weight`` and of it times ``x_hat``."""
        x_hat, invstd, weight = ctx.saved_tensors
        comm, count = ctx.comm, ctx.count
        d_weight = (dy * x_hat).sum(dim=0)
        d_bias = dy.sum(dim=0)
        dx_hat = dy * weight
        sums = torch.cat([dx_hat.sum(dim=0), (dx_hat * x_hat).sum(dim=0)]).double().to(comm.device)
        comm.allreduce_(sums, "sum", tag="norm")
        width = x_hat.shape[1]
        s1 = sums[:width].to(device=dy.device, dtype=dy.dtype)
        s2 = sums[width:].to(device=dy.device, dtype=dy.dtype)
        dx = invstd * (dx_hat - s1 / count - x_hat * (s2 / count))
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
        mean, var, count = stats[0]
        with torch.no_grad():
            unbiased = var * (count / max(count - 1.0, 1.0))
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_var.mul_(1 - m).add_(unbiased, alpha=m)
            self.num_batches_tracked += 1
        return y


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
