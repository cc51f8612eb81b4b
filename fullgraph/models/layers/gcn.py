"""The GCN layer (Kipf and Welling; PyG ``GCNConv``): ``Y = D^-1/2 (A + I) D^-1/2 (H W) + b``.

Degrees are the GLOBAL in-degrees plus one (the self-loop), so a rank's rows equal the rows of
one process. Weights are Glorot-uniform, biases zero, as PyG initialises them.
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
class GCNLayer(GraphLayer):
    """``Â (H W) + b`` with ``Â = D^-1/2 (A + I) D^-1/2``.

    Args:
        in_dim: input width.
        out_dim: output width.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]
    """

    kind = "gcn"
    fresh_input_grad = True
    prunable = True

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim)
        self.lin = nn.Linear(in_dim, out_dim, bias=True)
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)

    @staticmethod
    def operator(base: CSRMatrix, degree: torch.Tensor, num_inner: int) -> CSRMatrix:
        """``D^-1/2 (A + I) D^-1/2`` over the rank's rows (global degrees + 1)."""
        deg = degree + 1
        return base.with_self_loops().gcn_normalized(deg[:num_inner], deg)

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
        """``Â (h W^T) + b`` (:func:`~fullgraph.models.graph_linear.graph_linear`)."""
        lin = self.lin
        op, plan = ctx.layer_graph(index, training)
        return graph_linear(
            h, op, plan, lin.weight, lin.bias, precomputed=precomputed, rebuild=rebuild
        )
