"""The GraphSAGE layer with mean aggregation (PyG ``SAGEConv(aggr="mean")``):
``Y = mean_{j in N(i)} H_j W_l + b_l + H_i W_r``.

Weights use ``nn.Linear``'s default initialisation, as PyG's ``Linear`` with
``weight_initializer=None``; the root term has no bias.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.graph_linear import graph_linear
from fullgraph.models.layers.base import GraphLayer, register_layer


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
    fresh_input_grad = True
    prunable = True
    root_term = True

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
        rebuild: Callable[[], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``mean(h_N) W_l + b_l + h W_r`` (:func:`~fullgraph.models.graph_linear.graph_linear`)."""
        lin = self.lin
        op, plan = ctx.layer_graph(index, training)
        return graph_linear(
            h,
            op,
            plan,
            lin.weight,
            lin.bias,
            self.root.weight,
            precomputed=precomputed,
            rebuild=rebuild,
        )
