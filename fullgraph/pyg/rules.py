"""How :func:`fullgraph.pyg.distribute` treats each module, first match first: :data:`RULES`
(the table of ``docs/pyg.md``: :func:`support_table` writes it, a test compares them), and
:func:`twin_of`, which applies them to one module."""

from __future__ import annotations

from torch import nn

import fullgraph.pyg.handlers as h
from fullgraph.pyg.edge_twins import GATConvEdgeTwin, GINEConvTwin
from fullgraph.pyg.rule import WHOLE_GRAPH, Conversion, Rule, refuse
from fullgraph.pyg.twins import (
    BatchNormTwin,
    GCNConvTwin,
    GINConvTwin,
    GraphConvTwin,
    HashedDropout,
    SAGEConvTwin,
    TrimToLayerTwin,
)

#: Twins already in a model (a second conversion keeps them).
TWINS = (
    GCNConvTwin,
    SAGEConvTwin,
    GINConvTwin,
    GINEConvTwin,
    GATConvEdgeTwin,
    GraphConvTwin,
    BatchNormTwin,
    HashedDropout,
    TrimToLayerTwin,
)

#: torch modules kept as they are: they act on every row alone.
_ROW_WISE = (
    "Linear",
    "Bilinear",
    "Identity",
    "GroupNorm",
    "Threshold",
    "ReLU",
    "Hardtanh",
    "ReLU6",
    "Sigmoid",
    "Hardsigmoid",
    "Tanh",
    "SiLU",
    "Mish",
    "Hardswish",
    "ELU",
    "CELU",
    "SELU",
    "GELU",
    "Hardshrink",
    "LeakyReLU",
    "LogSigmoid",
    "Softplus",
    "Softshrink",
    "PReLU",
    "Softsign",
    "Tanhshrink",
)
_CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")

_MESSAGE_PASSING = (
    "fullgraph has distributed twins of GCNConv, SAGEConv and GraphConv (aggr 'mean', 'sum' "
    "or 'max'), GATConv, GINConv and GINEConv only; another message-passing layer cannot be "
    "split across ranks exactly"
)

_G = "torch_geometric.nn."
_RANDOM = "its random draws are not keyed by node: use nn.Dropout"

#: How :func:`distribute` treats each module, first match first (the docs' table).
RULES: tuple[Rule, ...] = (
    Rule(
        (f"{_G}GCNConv",),
        "twin",
        "`D^-1/2 (A_w + f I) D^-1/2` with global (weighted) degrees, `improved` (`f = 2`), "
        "`edge_weight=data.edge_weight` of the part in the call, `bias`, `cached` (ignored: "
        "the operator is built once). Refused: `normalize=False`, `add_self_loops=False`, "
        "another `aggr` or `flow`, any other `edge_weight` in the call",
        h.gcn,
    ),
    Rule(
        (f"{_G}SAGEConv",),
        "twin",
        "`aggr='mean'`, `'sum'` / `'add'` or `'max'` (the input's halo rows exchanged, ties to "
        "the lowest global id); `project`, `normalize`, `root_weight`, `bias`. Refused: other "
        "aggregations, bipartite input, `flow`",
        h.sage,
    ),
    Rule(
        (f"{_G}GATConv",),
        "twin",
        "the `gat` layer kind: `heads`, `concat`, `dropout` (attention dropout, hashed per "
        "edge), `bias`, `residual`; with `edge_dim`, called with `edge_attr=data.edge_attr` of "
        "the part: the edge term `a_edge . lin_edge(e_ji)` added to the logits, `fill_value` "
        "`'mean'` (default), `'add'` or a number for the self-loops, any `negative_slope` "
        "(torch operations over the rank's edges). Refused: bipartite input, "
        "`add_self_loops=False`, `negative_slope` other than 0.2 without `edge_dim`, "
        "`return_attention_weights`, another `fill_value`",
        h.gat,
    ),
    Rule(
        (f"{_G}GINConv",),
        "twin",
        "`nn((1 + eps) x_i + sum_j x_j)`, the sum over incoming neighbours; `eps`, "
        "`train_eps`; its `nn` is converted in turn. Refused: bipartite input",
        h.gin,
    ),
    Rule(
        (f"{_G}GINEConv",),
        "twin",
        "`nn((1 + eps) x_i + sum_j ReLU(x_j + lin(e_ji)))` over incoming edges, `eps`, "
        "`train_eps`, `edge_dim` (its `lin`); called with `edge_attr=data.edge_attr` of the "
        "part; its `nn` is converted in turn. Refused: bipartite input, any other `edge_attr`",
        h.gine,
    ),
    Rule(
        (f"{_G}GraphConv",),
        "twin",
        "`lin_rel(aggr_j x_j) + lin_root(x_i)` with `aggr='add'` / `'sum'`, `'mean'` or `'max'` "
        "(as `SAGEConv`), `bias`. Refused: `edge_weight` in the call, other aggregations, "
        "bipartite input, `flow`",
        h.graphconv,
    ),
    Rule(
        (f"{_G}conv.MessagePassing",),
        "refused",
        "every other message-passing layer (`GATv2Conv`, `PNAConv`, `EdgeConv`, ...)",
        h.refuser(_MESSAGE_PASSING),
        exact=False,
    ),
    Rule(
        ("torch.nn.BatchNorm1d", "torch.nn.SyncBatchNorm"),
        "twin",
        "moments over every rank's rows, running statistics as torch. Refused: "
        "`affine=False`, `track_running_stats=False`, `momentum=None`",
        h.batch_norm,
        exact=False,
    ),
    Rule(
        ("torch.nn.Dropout",),
        "twin",
        "masks hashed from (seed, step, call index, global node id, column)",
        h.dropout,
    ),
    Rule(
        ("torch.nn.modules.dropout._DropoutNd", "torch.nn.RReLU"),
        "refused",
        "`AlphaDropout`, `Dropout1d/2d/3d`, `FeatureAlphaDropout`, `RReLU`: " + _RANDOM,
        h.refuser(_RANDOM),
        exact=False,
        label="other dropout modules, `torch.nn.RReLU`",
    ),
    Rule(
        (f"{_G}BatchNorm",),
        "walked",
        "its `BatchNorm1d` is converted. Refused: `allow_single_element=True`",
        h.pyg_batch_norm,
    ),
    Rule(
        (f"{_G}LayerNorm",),
        "kept",
        "`mode='node'` (each node on its own). Refused: `mode='graph'` (the default)",
        h.pyg_layer_norm,
    ),
    Rule(
        ("torch.nn.LayerNorm", "torch.nn.RMSNorm"),
        "kept",
        "`normalized_shape` the feature width",
        h.per_row,
        exact=False,
    ),
    Rule(
        ("torch.nn.Softmax", "torch.nn.Softmin", "torch.nn.LogSoftmax", "torch.nn.GLU"),
        "kept",
        "`dim=-1` or `1`. Refused: `dim=0` (mixes nodes)",
        h.softmax,
        exact=False,
    ),
    Rule(
        (f"{_G}MLP",),
        "walked",
        "`dropout` (its `F.dropout` calls are made exact), `norm='batch_norm'` (converted), "
        "`'layer_norm'` with `norm_kwargs={'mode': 'node'}`",
        h.walk,
    ),
    Rule(
        (f"{_G}Linear", f"{_G}JumpingKnowledge"),
        "kept",
        "row-wise; `JumpingKnowledge` modes `cat`, `max` and `lstm` (per node)",
        h.keep,
        exact=False,
    ),
    Rule(
        tuple(f"torch.nn.{name}" for name in _ROW_WISE),
        "kept",
        "row-wise",
        h.keep,
        exact=False,
        label="`torch.nn` `Linear`, `Bilinear`, `Identity`, `GroupNorm` and the activations "
        "(`ReLU`, `ELU`, `GELU`, `LeakyReLU`, `PReLU`, ...)",
    ),
    Rule(
        tuple(f"torch.nn.{name}" for name in _CONTAINERS),
        "walked",
        "containers",
        h.walk,
        exact=False,
    ),
    Rule(
        (f"{_G}models.basic_gnn.BasicGNN",),
        "walked",
        "PyG's `GCN`, `GraphSAGE`, `GAT`, `GIN` models with `num_layers`, `out_channels`, "
        "`dropout`, `act`, `act_first`, `norm` (`batch_norm`; `layer_norm` with "
        "`norm_kwargs={'mode': 'node'}`), `jk` (`last`, `cat`, `max`, `lstm`) and their layer's "
        "options above (refused: `GAT(v2=True)`, `PNA`, `EdgeCNN`: their layers have no twin)",
        h.walk,
        exact=False,
        label="`torch_geometric.nn.models.GCN`, `GraphSAGE`, `GAT`, `GIN` (any `BasicGNN`)",
    ),
    Rule(
        ("torch_geometric.utils._trim_to_layer.TrimToLayer",),
        "twin",
        "inside every `BasicGNN`: refuses `num_sampled_nodes_per_hop` when called (sampled "
        "subgraphs)",
        h.trim,
    ),
    Rule(
        (f"{_G}aggr.Aggregation",),
        "refused",
        "pooling and aggregation over nodes: " + WHOLE_GRAPH,
        h.refuser(f"pooling and aggregation over nodes: {WHOLE_GRAPH}"),
        exact=False,
    ),
    Rule(
        (),
        "refused",
        "pooling over nodes: " + WHOLE_GRAPH,
        h.refuser(f"pooling and aggregation over nodes: {WHOLE_GRAPH}"),
        prefix="torch_geometric.nn.pool",
        label="`torch_geometric.nn.pool.*`",
    ),
    Rule(
        (),
        "refused",
        "`GraphNorm`, `InstanceNorm`, `PairNorm`, ...: " + WHOLE_GRAPH,
        h.refuser(WHOLE_GRAPH),
        prefix="torch_geometric.nn.norm",
        label="other `torch_geometric.nn.norm.*`",
    ),
    Rule(
        (),
        "walked",
        "your own modules (not torch's or PyG's); any other torch or PyG module is refused as "
        "not known to act on every node's row alone",
        h.ours,
        label="anything else",
    ),
)


def _lazy(module: nn.Module) -> bool:
    return any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters())


def twin_of(path: str, module: nn.Module, c: Conversion) -> nn.Module | bool:
    """The twin of ``module``, ``True`` to keep it and look at its children, ``False`` to keep
    it as it is.

    Raises:
        ConfigError: ``module`` cannot be distributed exactly (path, class and why).
    """
    if isinstance(module, TWINS) or getattr(module, "_part", None) is c.part:
        return False
    if _lazy(module):
        raise refuse(path, module, "lazy parameters (in_channels=-1): give the input width")
    for rule in RULES:
        if rule.matches(module):
            return rule.handle(path, module, c)
    raise AssertionError("the last rule matches every module")  # pragma: no cover


def support_table() -> str:
    """:data:`RULES` and the watched calls (:mod:`fullgraph.pyg.functional`) as the markdown
    tables of ``docs/pyg.md``."""
    from fullgraph.pyg.functional import calls_table

    lines = [
        "| module | treatment | supported options; refused |",
        "|---|---|---|",
        "| any module with lazy parameters (`in_channels=-1`) | refused | give the input width |",
        *(rule.row() for rule in RULES),
    ]
    return "\n".join(lines) + "\n\n" + calls_table()
