"""The GCN layer (Kipf and Welling; PyG ``GCNConv``): ``Y = D^-1/2 (A + I) D^-1/2 (H W) + b``.

Degrees are the GLOBAL in-degrees plus one (the self-loop), so a rank's rows equal the rows of
one process. Weights are Glorot-uniform, biases zero, as PyG initialises them.

With edge weights and / or ``improved`` (:func:`weighted_gcn_operator`; PyG's ``gcn_norm`` with
``edge_weight`` and ``improved=True``): ``Â = D^-1/2 (A_w + f I) D^-1/2`` with self-loop fill
``f`` = 2 when improved, else 1, and ``D_v = f + sum of the weights of v's incoming edges`` over
the WHOLE graph. A part stores every edge with its target's owner, so the inner rows' weights are
local; the source (column) degrees of halo nodes come from the part's ``in_weight`` (the global
weighted in-degree of every local node, written at partition time), so no set-up exchange is
needed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.graph_linear import graph_linear
from fullgraph.models.layers.base import GraphLayer, register_layer


def weighted_gcn_operator(
    base: CSRMatrix,
    in_weight: torch.Tensor,
    num_inner: int,
    edge_weight: torch.Tensor | None,
    improved: bool,
) -> CSRMatrix:
    """``D^-1/2 (A_w + f I) D^-1/2`` over the rank's rows (PyG ``gcn_norm``).

    Args:
        base: the part's local CSR of incoming edges (no values; no self-loops stored).
        in_weight: GLOBAL weighted in-degree of every local node without the self-loop, float64
            [num_local] (the plain in-degree when there are no edge weights).
        num_inner: rows.
        edge_weight: weight of every stored edge, [nnz], in the order of ``base``; ``None``:
            every weight 1.
        improved: self-loop fill 2 instead of 1.

    Returns:
        The operator, rows = inner nodes, the self-loop last in every row.
    """
    fill = 2.0 if improved else 1.0
    weights = torch.ones(base.nnz, dtype=torch.float64) if edge_weight is None else edge_weight
    a = base.with_self_loops()
    w = torch.full((a.nnz,), fill, dtype=torch.float64)
    loop = a.indptr[1:] - 1
    keep = torch.ones(a.nnz, dtype=torch.bool)
    keep[loop] = False
    w[keep] = weights.to(torch.float64)
    deg = in_weight.to(torch.float64) + fill
    inv = torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))
    return a.with_values(inv[a.row_of_entry()] * w * inv[a.indices.to(torch.int64)])


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
