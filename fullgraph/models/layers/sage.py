"""The GraphSAGE layer with mean aggregation (PyG ``SAGEConv(aggr="mean")``):
``Y = mean_{j in N(i)} H_j W_l + b_l + H_i W_r``.

Weights use ``nn.Linear``'s default initialisation, as PyG's ``Linear`` with
``weight_initializer=None``; the root term has no bias.
"""

from __future__ import annotations

import torch
from torch import nn

from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.layers.base import GraphLayer, aggregate_linear, register_layer, times_weight


@register_layer
class SAGELayer(GraphLayer):
    """``mean(H_N(i)) W_l + b_l + H_i W_r``.

    Args:
        in_dim: input width.
        out_dim: output width.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]
    """

    kind = "sage"

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim)
        self.lin = nn.Linear(in_dim, out_dim, bias=True)
        self.root = nn.Linear(in_dim, out_dim, bias=False)

    @staticmethod
    def operator(base: CSRMatrix, degree: torch.Tensor, num_inner: int) -> CSRMatrix:
        """The mean over every inner node's incoming neighbours."""
        return base.mean_normalized()

    def forward(
        self,
        h: torch.Tensor | CSRMatrix,
        ctx: GraphContext,
        precomputed: torch.Tensor | None = None,
        *,
        epoch: int = 0,
        training: bool = False,
        index: int = 0,
    ) -> torch.Tensor:
        """``mean(h_N) W_l + b_l + h W_r``."""
        return aggregate_linear(self.lin, h, ctx, precomputed) + times_weight(h, self.root.weight)
