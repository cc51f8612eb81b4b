"""The GraphSAGE layer (PyG ``SAGEConv(aggr=...)``):
``Y = aggr_{j in N(i)} H_j W_l + b_l + H_i W_r`` with ``aggr`` the mean (the default), the sum or
the maximum over the incoming neighbours (``--aggr``; duplicates kept, no self-loop, as PyG).

Weights use ``nn.Linear``'s default initialisation, as PyG's ``Linear`` with
``weight_initializer=None``; the root term has no bias.

Distribution: the mean and the sum are linear, so the body is
:func:`~fullgraph.models.graph_linear.graph_linear` on the kind's operator (the narrower
exchange, the precomputed first aggregation, sparse input and pruning apply). The maximum does
not commute with ``W_l``: the layer exchanges its INPUT's halo rows and takes the maximum over
``[inner; halo]`` rows (:meth:`~fullgraph.models.context.GraphContext.aggregate_max`, ties to
the lowest global id, so P ranks route every gradient as one process does); its stack has no
operator, no precomputed aggregation, no sparse input and no pruning (:class:`SAGEMaxLayer`).
Its two products are :func:`~fullgraph.models.mixed_linear.mixed_linear` (float32): under the
step's block tree the weight and bias gradients are per-block partials, the same bits at any
rank count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from fullgraph.errors import ConfigError
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
from fullgraph.models.local_graph import local_csr, no_operator, sum_operator
from fullgraph.models.mixed_linear import mixed_linear

if TYPE_CHECKING:
    from fullgraph.partition import Partition

#: The neighbour aggregations of ``--aggr``.
AGGREGATIONS = ("mean", "sum", "max")


def _sage_kwargs(args: ExportArgs) -> dict[str, int | str | bool]:
    """PyG's ``GraphSAGE`` aggregates by the mean unless told otherwise."""
    return {} if args.get("aggr") in (None, "mean") else {"aggr": str(args["aggr"])}


@register_layer
class SAGELayer(GraphLayer):
    """``aggr(H_N(i)) W_l + b_l + H_i W_r`` (the mean aggregation; see :meth:`variant`).

    Args:
        in_dim: input width.
        out_dim: output width.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]

    Attributes:
        lin: ``W_l``, ``b_l`` (PyG's ``lin_l``).
        root: ``W_r``, no bias (PyG's ``lin_r``).
    """

    kind = "sage"
    fresh_input_grad = True
    prunable = True
    root_term = True
    accepts = ("aggr",)
    replay = "linear"
    pyg = PygExport(
        conv="SAGEConv",
        name="GraphSAGE",
        keys={
            "lin_l.weight": "lin.weight",
            "lin_l.bias": "lin.bias",
            "lin_r.weight": "root.weight",
        },
        basic_gnn="GraphSAGE",
        basic_kwargs=_sage_kwargs,
    )
    #: the aggregation of this class
    aggr: ClassVar[str] = "mean"
    #: the class of every aggregation of this kind (set below the classes)
    VARIANTS: ClassVar[dict[str, type[SAGELayer]]] = {}

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim)
        self.lin = nn.Linear(in_dim, out_dim, bias=True)
        self.root = nn.Linear(in_dim, out_dim, bias=False)

    @classmethod
    def variant(cls, options: LayerOptions | None) -> type[GraphLayer]:
        """The class of ``options.aggr`` (``None``: this kind's default).

        Raises:
            ConfigError: an aggregation this kind does not have.
        """
        aggr = options.aggr if options is not None else None
        if aggr is None:
            aggr = next(iter(cls.VARIANTS))  # the first is the default
        if aggr not in cls.VARIANTS:
            raise ConfigError(
                f"--aggr {aggr}: --model {cls.kind} aggregates by {', '.join(cls.VARIANTS)}"
            )
        return cls.VARIANTS[aggr]

    @classmethod
    def build(cls, in_dim: int, width: int, *, last: bool, options: LayerOptions) -> GraphLayer:
        """The layer of ``options.aggr`` (:meth:`variant`)."""
        return cls.variant(options)(in_dim, width)

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """The mean over every inner node's incoming neighbours."""
        return local_csr(part).mean_normalized()

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
        """``aggr(h_N) W_l + b_l + h W_r`` (:func:`~fullgraph.models.graph_linear.graph_linear`
        on the operator of the kind's aggregation)."""
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

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, aggr={self.aggr}"


class SAGESumLayer(SAGELayer):
    """:class:`SAGELayer` with the sum over the incoming neighbours (PyG ``aggr="sum"``)."""

    aggr = "sum"

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """The plain sum over every inner node's incoming neighbours (every value 1)."""
        return sum_operator(local_csr(part))


class MaxAggregation:
    """The traits and body of the max layers (mixed into a SAGE-like class): its input's halo
    rows exchanged, the maximum over ``[inner; halo]`` rows, then ``M W_l + b_l + h W_r``."""

    aggr = "max"
    precomputable = False  # the stack reads the edges and local global ids (needs_structure)
    prunable = False  # the pruned plans renumber the halo rows the maximum reads
    fresh_input_grad = False
    replay = "max"

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """No operator: the maximum reads ``ctx.structure``."""
        return no_operator(local_csr(part), int(part.num_inner))

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
        """``max(h_N) W_l + b_l + h W_r`` (``precomputed`` and ``rebuild`` never apply)."""
        if isinstance(h, CSRMatrix):
            raise ConfigError("the max aggregation takes dense input features")
        lin, root = self.lin, self.root
        m = ctx.aggregate_max(h)
        # mixed_linear: under the step's block tree, W_l, b_l and W_r take per-block partials
        out = mixed_linear(m, lin.weight, None, lin.bias)
        return out.add_(mixed_linear(h, root.weight, None))


class SAGEMaxLayer(MaxAggregation, SAGELayer):
    """:class:`SAGELayer` with the maximum over the incoming neighbours (PyG ``aggr="max"``)."""


SAGELayer.VARIANTS = {"mean": SAGELayer, "sum": SAGESumLayer, "max": SAGEMaxLayer}
