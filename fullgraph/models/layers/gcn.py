"""The GCN layer (Kipf and Welling; PyG ``GCNConv``): ``Y = D^-1/2 (A + I) D^-1/2 (H W) + b``.

Degrees are the GLOBAL in-degrees plus one (the self-loop), so a rank's rows equal the rows of
one process. Weights are Glorot-uniform, biases zero, as PyG initialises them.

With edge weights and / or ``improved`` (:func:`weighted_gcn_operator`; PyG's ``gcn_norm`` with
``edge_weight`` and ``improved=True``): ``Â = D^-1/2 (A_w + f I) D^-1/2`` with self-loop fill
``f`` = 2 when improved, else 1, and ``D_v = f + sum of the weights of v's incoming edges`` over
the WHOLE graph. A part stores every edge with its target's owner, so the inner rows' weights are
local; the source (column) degrees of halo nodes come from the part's ``in_weight`` (the global
weighted in-degree of every local node, written at partition time), so no set-up exchange is
needed. Both are layer options (``--edge-weight``, ``--improved``: :attr:`GCNLayer.accepts`);
an export to PyG does not carry them yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.graph_linear import graph_linear
from fullgraph.models.layers.base import GraphLayer, LayerOptions, PygExport, register_layer
from fullgraph.models.local_graph import as_tensor, in_degree, local_csr

if TYPE_CHECKING:
    from fullgraph.partition import Partition


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


def check_degrees(part: Partition, fill: float) -> None:
    """Refuse edge weights under which GCN's ``D^-1/2`` is not defined.

    A node's GCN degree is its self-loop weight ``fill`` plus the weights of its incoming
    edges; where that is 0 or less (negative weights, NaN), ``deg^-1/2`` is infinite or NaN and
    the node's row would silently vanish (PyG's ``gcn_norm`` gives NaN). Negative weights as
    such are data: a degree that stays positive is accepted.

    Args:
        part: the part (its ``in_weight``: GLOBAL weighted in-degrees of the local nodes).
        fill: the self-loop weight (2 with ``improved``).

    Raises:
        ConfigError: one line: how many of the part's nodes, the first one's degree, how many
            stored weights are negative.
    """
    if part.in_weight is None:  # no weights: the caller says which are missing
        return
    inner = np.asarray(part.in_weight[: part.num_inner], np.float64) + fill
    bad = np.flatnonzero(~(inner > 0))
    if bad.size == 0:
        return
    first, weights = int(bad[0]), np.asarray(part.edge_weight)
    name = part.meta.get("dataset") or "the graph"
    where = f"{name}'s" if part.num_parts == 1 else f"part {part.rank}'s"
    raise ConfigError(
        f"gcn with edge weights: {bad.size} of {where} {part.num_inner} nodes have a degree "
        f"(self-loop {fill:g} + weighted in-degree) <= 0, where D^-1/2 is not defined (node "
        f"{int(part.global_ids[first])}: {inner[first]:g}); {int((weights < 0).sum())} of its "
        f"{weights.size} stored edge weights are negative: give weights that keep every degree "
        f"positive, or use the graph unweighted (a model trained without --edge-weight)"
    )


def _fill(options: LayerOptions) -> float:
    """The self-loop weight: 2 with ``improved``, else 1."""
    return 2.0 if options.improved else 1.0


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
    accepts = ("edge_weight", "improved")
    replay = "linear"
    self_loops = True
    pyg = PygExport(
        conv="GCNConv",
        name="GCN",
        keys={"lin.weight": "lin.weight", "bias": "lin.bias"},
        basic_gnn="GCN",
        not_exported=("edge_weight", "improved"),  # FullgraphGNN builds plain GCNConv layers
    )

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim)
        self.lin = nn.Linear(in_dim, out_dim, bias=True)
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.zeros_(self.lin.bias)

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """``D^-1/2 (A + I) D^-1/2`` over the rank's rows (global degrees + 1); with
        ``options.edge_weight`` and / or ``improved``, :func:`weighted_gcn_operator`.

        Raises:
            ConfigError: edge weights asked for but the part stores none, or weights that
                leave a degree <= 0 (:func:`check_degrees`).
        """
        base, ni = local_csr(part), int(part.num_inner)
        if not (options.edge_weight or options.improved):
            deg = in_degree(part) + 1
            return base.with_self_loops().gcn_normalized(deg[:ni], deg)
        if not options.edge_weight:
            return weighted_gcn_operator(base, in_degree(part), ni, None, options.improved)
        if part.edge_weight is None:
            raise ConfigError(
                "edge weights were asked for but the partition stores none (partition a graph "
                "with edge weights: an OGB-layout raw/edge_weight.csv.gz, or data.edge_weight)"
            )
        check_degrees(part, _fill(options))
        weights = as_tensor(part.edge_weight, np.float32)
        degree = as_tensor(part.in_weight, np.float64)
        return weighted_gcn_operator(base, degree, ni, weights, options.improved)

    @staticmethod
    def part_check(options: LayerOptions) -> Callable[[Partition], None] | None:
        """With edge weights: every degree of the part above 0 (:func:`check_degrees`)."""
        if not options.edge_weight:
            return None
        return functools.partial(check_degrees, fill=_fill(options))

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
