"""The per-row linear layer (``--model mlp``): ``Y = H W^T + b``, no neighbour aggregation.

A stack of these is the MLP of "MLP + C&S" and, with ``--layers 1``, the linear model of
"Linear + C&S" (Huang et al., ICLR 2021); it is also the MLP under APPNP's propagation
(:mod:`~fullgraph.models.layers.appnp`). ReLU, dropout, ``--norm`` and ``--residual`` between
layers are the stack's (:class:`~fullgraph.models.gnn.GNN`), as for every kind. Weights use
``nn.Linear``'s default initialisation (PyG's ``Linear`` and ``MLP`` with their defaults draw
from the same bounds).

Distribution: a row's output reads that row alone, so a rank computes its inner rows and
exchanges nothing in training or evaluation (its operator is empty; the halo plan is still
built, and unused). The product is :func:`~fullgraph.models.mixed_linear.mixed_linear`: under
the step's block tree its weight and bias gradients are per-block partials
(:class:`~fullgraph.models.mixed_linear.BlockLinearFunction`), the same bits at any rank
count, and under ``--precision bf16-mixed`` the product reads bfloat16 as GIN's second linear
layer does. What it keeps for the backward pass: its input (``4 n d``; under bf16-mixed its
bfloat16 copy, ``2 n d``); a dropped first-layer input is kept, not rebuilt. Dense input
features only (no CSR first layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.layers.base import GraphLayer, LayerOptions, PygExport, register_layer
from fullgraph.models.local_graph import local_csr, no_operator
from fullgraph.models.mixed_linear import mixed_linear

if TYPE_CHECKING:
    from fullgraph.partition import Partition


@register_layer
class MLPLayer(GraphLayer):
    """``h W^T + b`` on every row.

    Args:
        in_dim: input width.
        out_dim: output width.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]

    Attributes:
        lin: ``W``, ``b`` (PyG's ``Linear``).
    """

    kind = "mlp"
    precomputable = False  # no aggregation to compute once
    reads_edges = False  # nor any edge: no edge structure kept
    fresh_input_grad = True
    prunable = False  # nothing to prune: no operator
    per_row = True  # training may run on the loss's rows alone (training.train_rows)
    replay = "rows"
    pyg = PygExport(  # PyG's own MLP names its layers ``lins``, not ``convs``
        conv="Linear",
        name="MLP",
        keys={"weight": "lin.weight", "bias": "lin.bias"},
    )

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim)
        self.lin = nn.Linear(in_dim, out_dim, bias=True)

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """No operator: no row reads another."""
        return no_operator(local_csr(part), int(part.num_inner))

    def linear(self, h: torch.Tensor | CSRMatrix, ctx: GraphContext) -> torch.Tensor:
        """``h W^T + b`` (:func:`~fullgraph.models.mixed_linear.mixed_linear`: the block tree's
        partials in a training step, bfloat16 under bf16-mixed), a new tensor.

        Raises:
            ConfigError: sparse (CSR) input rows.
        """
        if isinstance(h, CSRMatrix):
            raise ConfigError(f"--model {self.kind} takes dense input features")
        return mixed_linear(h, self.lin.weight, ctx.plan.row_dtype, self.lin.bias)

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
        """``h W^T + b`` (``precomputed`` and ``rebuild`` never apply)."""
        return self.linear(h, ctx)

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}"
