"""The handlers of :data:`fullgraph.pyg.rules.RULES`: each builds a module's distributed twin
(checking the options the twin supports), keeps the module, or refuses it in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from fullgraph.models.layers import layer_kinds
from fullgraph.pyg.edge_twins import GATConvEdgeTwin, GINEConvTwin
from fullgraph.pyg.rule import WHOLE_GRAPH, Conversion, Handler, check, refuse
from fullgraph.pyg.twins import (
    BatchNormTwin,
    GCNConvTwin,
    GINConvTwin,
    GraphConvTwin,
    HashedDropout,
    SAGEConvTwin,
    TrimToLayerTwin,
    gat_twin_class,
)

if TYPE_CHECKING:
    from torch_geometric.nn import (
        BatchNorm,
        GATConv,
        GCNConv,
        GINConv,
        GINEConv,
        GraphConv,
        LayerNorm,
        SAGEConv,
    )


def gcn(path: str, conv: GCNConv, c: Conversion) -> nn.Module:
    """``GCNConv``: its twin, for Kipf-Welling GCN (normalised, self-loops, sum, in-edges)."""
    check(
        path,
        conv,
        (
            ("normalize=False", not conv.normalize),
            ("add_self_loops=False", not conv.add_self_loops),
            (f"aggr={conv.aggr!r}", conv.aggr != "add"),
            (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
        ),
        "is not supported (the twin is Kipf-Welling GCN)",
    )
    return GCNConvTwin(conv, c.part)


def check_sum_flow(path: str, conv: GINConv | GINEConv) -> None:
    """GIN's and GINE's options: the sum over incoming neighbours only."""
    check(
        path,
        conv,
        (
            (f"aggr={conv.aggr!r}", conv.aggr != "add"),
            (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
        ),
        "is not supported",
    )


def gine(path: str, conv: GINEConv, c: Conversion) -> nn.Module:
    """``GINEConv``: its twin (the sum over incoming neighbours only)."""
    check_sum_flow(path, conv)
    return GINEConvTwin(conv, c.part)


#: The ``aggr`` values of ``SAGEConv`` and ``GraphConv`` that have a twin.
AGGRS = ("mean", "sum", "add", "max")


def _check_aggregation(path: str, conv: SAGEConv | GraphConv, *others: tuple[str, bool]) -> None:
    """SAGE's and GraphConv's options: an aggregation of :data:`AGGRS`, over incoming
    neighbours, and ``others``."""
    if conv.aggr not in AGGRS:
        raise refuse(
            path, conv, f"aggr={conv.aggr!r}: only the mean, sum and max aggregations have a twin"
        )
    flow = (f"flow={conv.flow!r}", conv.flow != "source_to_target")
    check(path, conv, (*others, flow), "is not supported")


def sage(path: str, conv: SAGEConv, c: Conversion) -> nn.Module:
    """``SAGEConv``: its twin, for the aggregations that have one (:data:`AGGRS`)."""
    _check_aggregation(path, conv)
    return SAGEConvTwin(conv, c.part)


def graphconv(path: str, conv: GraphConv, c: Conversion) -> nn.Module:
    """``GraphConv``: its twin, for the aggregations that have one (:data:`AGGRS`)."""
    bipartite = isinstance(conv.in_channels, tuple)
    _check_aggregation(path, conv, ("bipartite input (a tuple of in_channels)", bipartite))
    return GraphConvTwin(conv, c.part)


def gat(path: str, conv: GATConv, c: Conversion) -> nn.Module:
    """``GATConv``: its twin (with edge features: the edge twin), its attention index counted."""
    if conv.edge_dim is not None:
        return gat_edges(path, conv, c)
    if "gat" not in layer_kinds():
        raise refuse(path, conv, "fullgraph has no gat layer kind in this installation")
    from fullgraph.models.layers.gat import NEGATIVE_SLOPE

    check(
        path,
        conv,
        (
            ("bipartite input (a tuple of in_channels)", conv.lin is None),
            ("add_self_loops=False", not conv.add_self_loops),
            (f"negative_slope={conv.negative_slope}", conv.negative_slope != NEGATIVE_SLOPE),
            (f"aggr={conv.aggr!r}", conv.aggr != "add"),
            (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
        ),
        "is not supported by the gat layer kind",
    )
    c.gat_count += 1
    return gat_twin_class()(conv, c.part, c.gat_count - 1)


def gat_edges(path: str, conv: GATConv, c: Conversion) -> nn.Module:
    """``GATConv`` with edge features: its edge twin."""
    fill = conv.fill_value
    check(
        path,
        conv,
        (
            ("bipartite input (a tuple of in_channels)", conv.lin is None),
            ("add_self_loops=False", not conv.add_self_loops),
            (
                f"fill_value={fill!r}",
                not (isinstance(fill, (int, float)) or fill in ("mean", "add")),
            ),
            (f"aggr={conv.aggr!r}", conv.aggr != "add"),
            (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
        ),
        "is not supported with edge_dim",
    )
    c.gat_count += 1
    return GATConvEdgeTwin(conv, c.part, c.gat_count - 1)


def gin(path: str, conv: GINConv, c: Conversion) -> nn.Module:
    """``GINConv``: its twin (the sum over incoming neighbours only)."""
    check_sum_flow(path, conv)
    return GINConvTwin(conv, c.part)


def batch_norm(path: str, bn: nn.BatchNorm1d | nn.SyncBatchNorm, c: Conversion) -> nn.Module:
    """``BatchNorm1d``: its twin (statistics over every rank's rows)."""
    check(
        path,
        bn,
        (
            ("affine=False", not bn.affine),
            ("track_running_stats=False", not bn.track_running_stats),
            ("momentum=None (cumulative average)", bn.momentum is None),
        ),
        "is not supported",
    )
    return BatchNormTwin(bn, c.part)


def dropout(path: str, module: nn.Dropout, c: Conversion) -> nn.Module:
    """``Dropout``: the hashed dropout, keyed by node."""
    if not 0.0 <= module.p < 1.0:
        raise refuse(path, module, f"p={module.p}: the drop probability must be below 1")
    return HashedDropout(module.p)


def pyg_batch_norm(path: str, module: BatchNorm, c: Conversion) -> bool:
    """PyG's ``BatchNorm``: kept, its ``BatchNorm1d`` looked at."""
    if module.allow_single_element:
        raise refuse(path, module, "allow_single_element=True is not supported")
    return True


def pyg_layer_norm(path: str, module: LayerNorm, c: Conversion) -> bool:
    """PyG's ``LayerNorm``: kept in ``mode='node'`` (each node on its own)."""
    if module.mode != "node":
        raise refuse(
            path,
            module,
            f"mode={module.mode!r}: {WHOLE_GRAPH}; use mode='node' (each node on its own)",
        )
    return False


def per_row(path: str, module: nn.LayerNorm | nn.RMSNorm, c: Conversion) -> bool:
    """torch's ``LayerNorm`` / ``RMSNorm``: kept over the feature width alone."""
    if len(module.normalized_shape) != 1:
        raise refuse(path, module, "normalized_shape must be the feature width alone")
    return False


def softmax(
    path: str, module: nn.Softmax | nn.Softmin | nn.LogSoftmax | nn.GLU, c: Conversion
) -> bool:
    """``Softmax``, ``Softmin``, ``LogSoftmax``, ``GLU``: kept over the feature axis."""
    if module.dim not in (None, -1, 1):
        raise refuse(path, module, f"dim={module.dim} mixes nodes (use dim=-1)")
    return False


def keep(path: str, module: nn.Module, c: Conversion) -> bool:
    """Kept as it is (it acts on every node's row alone)."""
    return False


def walk(path: str, module: nn.Module, c: Conversion) -> bool:
    """Kept, its children looked at."""
    return True


def trim(path: str, module: nn.Module, c: Conversion) -> nn.Module:
    """PyG's ``TrimToLayer``: its twin (a rank computes every layer on all its rows)."""
    return TrimToLayerTwin()


def refuser(why: str) -> Handler:
    """A handler refusing every module it is given, for ``why``."""

    def refusing(path: str, module: nn.Module, c: Conversion) -> bool:
        raise refuse(path, module, why)

    return refusing


def ours(path: str, module: nn.Module, c: Conversion) -> bool:
    """A module the user defined (not torch's or PyG's): kept, its children looked at."""
    name = type(module).__module__
    if name.startswith("torch.") or name.startswith("torch_geometric."):
        raise refuse(path, module, "not known to act on every node's row alone")
    return True
