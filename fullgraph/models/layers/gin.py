"""The graph isomorphism layer (Xu et al.; PyG ``GINConv(nn, train_eps=True)``):
``Y = nn((1 + eps) H_i + sum_{j in N(i)} H_j)`` with ``nn = Linear -> ReLU -> Linear``.

The sum runs over the incoming neighbours (duplicates kept, no self-loop), as PyG's
``aggr="add"``. ``eps`` is a parameter (initially 0), the MLP's hidden width is the layer's
output width, and both linear layers use ``nn.Linear``'s default initialisation (the ``nn`` a
user builds from ``torch.nn.Linear``).

Distribution: the first linear layer distributes over the sum, ``Lin1((1 + eps) h + A h) =
A (h W1^T) + b1 + h ((1 + eps) W1)^T``, so the body is
:func:`~fullgraph.models.graph_linear.graph_linear` with the root weight ``(1 + eps) W1`` (the
SAGE body: the narrower exchange, the precomputed first aggregation, sparse input and pruning
all apply); the ReLU (in place) and the second linear layer are per row.

Under the step's block tree (:mod:`fullgraph.distributed.tree_sum`) the root weight is a
stand-in for ``(1 + eps) W1`` (:meth:`~fullgraph.distributed.tree_sum.BlockGradients.derive`):
its gradient is summed per block over the tree like ``W1``'s own, then taken back through the
product to ``eps`` and ``W1`` (which gets the root's part added to its tree root), the same
bits at any rank count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from fullgraph.distributed.tree_sum import active_gradients
from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.graph_linear import graph_linear
from fullgraph.models.layers.base import (
    ExportArgs,
    GraphLayer,
    LayerOptions,
    PygExport,
    register_layer,
)
from fullgraph.models.local_graph import local_csr, sum_operator
from fullgraph.models.mixed_linear import mixed_linear

if TYPE_CHECKING:
    from fullgraph.partition import Partition


def _gin_kwargs(args: ExportArgs) -> dict[str, int | str | bool] | None:
    """PyG's ``GIN`` with a trainable ``eps``; none with a norm (it puts one inside every
    MLP)."""
    return None if args["norm"] is not None else {"train_eps": True}


@register_layer
class GINLayer(GraphLayer):
    """``Lin2(ReLU(Lin1((1 + eps) h_i + sum(h_N(i)))))``.

    Args:
        in_dim: input width.
        out_dim: output width (and the MLP's hidden width).

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]

    Attributes:
        eps: the trainable ``eps``, [1] (PyG's ``GINConv.eps``).
        mlp: ``Sequential(Linear(in, out), ReLU(), Linear(out, out))`` (PyG's ``GINConv.nn``).
    """

    kind = "gin"
    fresh_input_grad = True
    prunable = True
    root_term = True
    row_mlp = True
    replay = "linear"
    pyg = PygExport(
        conv="GINConv",
        name="GIN",
        keys={
            "eps": "eps",
            "nn.lins.0.weight": "mlp.0.weight",
            "nn.lins.0.bias": "mlp.0.bias",
            "nn.lins.1.weight": "mlp.2.weight",
            "nn.lins.1.bias": "mlp.2.bias",
        },
        basic_gnn="GIN",
        basic_kwargs=_gin_kwargs,
    )

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim)
        self.eps = nn.Parameter(torch.zeros(1))
        self.mlp = nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """The plain sum over every inner node's incoming neighbours (every value 1)."""
        return sum_operator(local_csr(part))

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
        """``Lin2(relu(A h W1^T + b1 + h ((1 + eps) W1)^T))`` (the body:
        :func:`~fullgraph.models.graph_linear.graph_linear`, its output a new tensor, so the
        ReLU works in place)."""
        lin1, lin2 = self.mlp[0], self.mlp[2]
        op, plan = ctx.layer_graph(index, training)
        root = lin1.weight * (1 + self.eps)
        tree = active_gradients()
        rows = h.num_rows if isinstance(h, CSRMatrix) else int(h.shape[0])
        if tree is not None and root.requires_grad and tree.handles(lin1.weight, rows):
            stand_in = root.detach().requires_grad_()
            tree.derive(stand_in, root, [lin1.weight, self.eps])
            root = stand_in  # a leaf over every inner row: graph_linear pushes its partials
        y = graph_linear(
            h, op, plan, lin1.weight, lin1.bias, root, precomputed=precomputed, rebuild=rebuild
        )
        return mixed_linear(torch.relu_(y), lin2.weight, plan.row_dtype, lin2.bias)
