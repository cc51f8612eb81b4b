"""Converting a PyG model for a rank's part: :func:`distribute`.

Every module of the model is looked at, from the root down, and treated by the first rule of
:data:`RULES` that matches it:

- ``twin``: replaced by its distributed twin (:mod:`fullgraph.pyg.twins`) holding the same
  parameters (``GCNConv``, ``SAGEConv``, ``GraphConv``, ``GATConv``, ``GINConv``, ``BatchNorm1d``,
  ``Dropout``);
- ``kept``: kept as it is, because it acts on every node's row alone, which is exact on any
  number of ranks (``Linear``, activations, per-node normalisations, ``JumpingKnowledge``);
- ``walked``: kept, its children looked at in turn (containers, PyG's ``BasicGNN`` models
  ``GCN`` / ``GraphSAGE`` / ``GAT`` / ``GIN``, ``MLP``, the user's own modules);
- ``refused``: a :class:`~fullgraph.errors.ConfigError` of one line naming its path, class and
  why (other message-passing layers, whole-graph normalisation and pooling, ...).

The user's own ``forward`` code is not inspected: it must treat nodes row by row (no
``x.mean(dim=0)``, no global pooling). Its dropout calls and random draws are watched while it
runs (:mod:`fullgraph.pyg.functional`). :func:`support_table` writes :data:`RULES` as the table
of ``docs/pyg.md`` (a test compares them).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.models.layers import layer_kinds
from fullgraph.precision import FLOAT32, Precision, resolve_precision
from fullgraph.pyg.edge_twins import GATConvEdgeTwin, GINEConvTwin
from fullgraph.pyg.node_rows import watch
from fullgraph.pyg.part_data import PartGraph, part_graph_of
from fullgraph.pyg.runtime import ModelRun
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
_WHOLE_GRAPH = "its statistics are taken over all nodes of a graph at once"


@dataclass
class _Conversion:
    """The state of one :func:`distribute` call: the part and the attention layers so far."""

    part: PartGraph
    gat_count: int = 0


#: What a rule's handler returns: the twin, ``True`` (keep, look at the children) or ``False``
#: (keep as it is). It raises :class:`~fullgraph.errors.ConfigError` to refuse.
Handler = Callable[[str, nn.Module, _Conversion], "nn.Module | bool"]


@dataclass(frozen=True)
class Rule:
    """How :func:`distribute` treats the modules one rule matches.

    Attributes:
        classes: dotted names of the classes matched (resolved on first use; a name the
            installed torch or PyG lacks matches nothing).
        treatment: ``twin``, ``kept``, ``walked`` or ``refused`` (for the docs).
        notes: the supported options and what is refused, or why the module is refused.
        handle: the handler (:data:`Handler`).
        exact: match the classes themselves, not their subclasses.
        prefix: match instead every class defined in a module whose name starts with this
            (a rule without classes and prefix matches every module).
        label: the docs' name of what is matched (default: the class names).
    """

    classes: tuple[str, ...]
    treatment: str
    notes: str
    handle: Handler
    exact: bool = True
    prefix: str = ""
    label: str = ""
    _resolved: list[tuple[type, ...]] = field(default_factory=list, compare=False, repr=False)

    def types(self) -> tuple[type, ...]:
        """The classes of :attr:`classes` (imported once)."""
        if not self._resolved:
            found = []
            for name in self.classes:
                module, _, attr = name.rpartition(".")
                try:
                    found.append(getattr(importlib.import_module(module), attr))
                except (ImportError, AttributeError):
                    pass
            self._resolved.append(tuple(found))
        return self._resolved[0]

    def matches(self, module: nn.Module) -> bool:
        """Whether this rule treats ``module``."""
        cls = type(module)
        if self.prefix or not self.classes:
            return cls.__module__.startswith(self.prefix)
        if self.exact:
            return cls in self.types()
        return isinstance(module, self.types())

    def row(self) -> str:
        """The rule as a row of the docs' table."""
        what = self.label or ", ".join(f"`{c}`" for c in self.classes)
        return f"| {what} | {self.treatment} | {self.notes} |"


def _refuse(path: str, module: nn.Module, why: str) -> ConfigError:
    cls = type(module)
    return ConfigError(
        f"{path} ({cls.__module__}.{cls.__qualname__}) cannot be distributed exactly: {why}"
    )


def _check(path: str, module: nn.Module, checks: tuple[tuple[str, bool], ...], why: str) -> None:
    for what, bad in checks:
        if bad:
            raise _refuse(path, module, f"{what} {why}")


def _gcn(path: str, conv: Any, c: _Conversion) -> nn.Module:
    _check(
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


def _check_sum_flow(path: str, conv: Any) -> None:
    """GIN's and GINE's options: the sum over incoming neighbours only."""
    _check(
        path,
        conv,
        (
            (f"aggr={conv.aggr!r}", conv.aggr != "add"),
            (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
        ),
        "is not supported",
    )


def _gine(path: str, conv: Any, c: _Conversion) -> nn.Module:
    _check_sum_flow(path, conv)
    return GINEConvTwin(conv, c.part)


#: The ``aggr`` values of ``SAGEConv`` and ``GraphConv`` that have a twin.
_AGGRS = ("mean", "sum", "add", "max")


def _sage(path: str, conv: Any, c: _Conversion) -> nn.Module:
    if conv.aggr not in _AGGRS:
        raise _refuse(
            path, conv, f"aggr={conv.aggr!r}: only the mean, sum and max aggregations have a twin"
        )
    _check(
        path,
        conv,
        ((f"flow={conv.flow!r}", conv.flow != "source_to_target"),),
        "is not supported",
    )
    return SAGEConvTwin(conv, c.part)


def _graphconv(path: str, conv: Any, c: _Conversion) -> nn.Module:
    if conv.aggr not in _AGGRS:
        raise _refuse(
            path, conv, f"aggr={conv.aggr!r}: only the mean, sum and max aggregations have a twin"
        )
    _check(
        path,
        conv,
        (
            ("bipartite input (a tuple of in_channels)", isinstance(conv.in_channels, tuple)),
            (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
        ),
        "is not supported",
    )
    return GraphConvTwin(conv, c.part)


def _gat(path: str, conv: Any, c: _Conversion) -> nn.Module:
    if conv.edge_dim is not None:
        return _gat_edges(path, conv, c)
    if "gat" not in layer_kinds():
        raise _refuse(path, conv, "fullgraph has no gat layer kind in this installation")
    from fullgraph.models.layers.gat import NEGATIVE_SLOPE

    _check(
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


def _gat_edges(path: str, conv: Any, c: _Conversion) -> nn.Module:
    fill = conv.fill_value
    _check(
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


def _gin(path: str, conv: Any, c: _Conversion) -> nn.Module:
    _check_sum_flow(path, conv)
    return GINConvTwin(conv, c.part)


def _batch_norm(path: str, bn: Any, c: _Conversion) -> nn.Module:
    _check(
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


def _dropout(path: str, module: Any, c: _Conversion) -> nn.Module:
    if not 0.0 <= module.p < 1.0:
        raise _refuse(path, module, f"p={module.p}: the drop probability must be below 1")
    return HashedDropout(module.p)


def _pyg_batch_norm(path: str, module: Any, c: _Conversion) -> bool:
    if module.allow_single_element:
        raise _refuse(path, module, "allow_single_element=True is not supported")
    return True


def _pyg_layer_norm(path: str, module: Any, c: _Conversion) -> bool:
    if module.mode != "node":
        raise _refuse(
            path,
            module,
            f"mode={module.mode!r}: {_WHOLE_GRAPH}; use mode='node' (each node on its own)",
        )
    return False


def _per_row(path: str, module: Any, c: _Conversion) -> bool:
    if len(module.normalized_shape) != 1:
        raise _refuse(path, module, "normalized_shape must be the feature width alone")
    return False


def _softmax(path: str, module: Any, c: _Conversion) -> bool:
    if module.dim not in (None, -1, 1):
        raise _refuse(path, module, f"dim={module.dim} mixes nodes (use dim=-1)")
    return False


def _keep(path: str, module: nn.Module, c: _Conversion) -> bool:
    return False


def _walk(path: str, module: nn.Module, c: _Conversion) -> bool:
    return True


def _trim(path: str, module: nn.Module, c: _Conversion) -> nn.Module:
    return TrimToLayerTwin()


def _refuser(why: str) -> Handler:
    def refuse(path: str, module: nn.Module, c: _Conversion) -> bool:
        raise _refuse(path, module, why)

    return refuse


def _ours(path: str, module: nn.Module, c: _Conversion) -> bool:
    """A module the user defined (not torch's or PyG's): kept, its children looked at."""
    name = type(module).__module__
    if name.startswith("torch.") or name.startswith("torch_geometric."):
        raise _refuse(path, module, "not known to act on every node's row alone")
    return True


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
        _gcn,
    ),
    Rule(
        (f"{_G}SAGEConv",),
        "twin",
        "`aggr='mean'`, `'sum'` / `'add'` or `'max'` (the input's halo rows exchanged, ties to "
        "the lowest global id); `project`, `normalize`, `root_weight`, `bias`. Refused: other "
        "aggregations, bipartite input, `flow`",
        _sage,
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
        _gat,
    ),
    Rule(
        (f"{_G}GINConv",),
        "twin",
        "`nn((1 + eps) x_i + sum_j x_j)`, the sum over incoming neighbours; `eps`, "
        "`train_eps`; its `nn` is converted in turn. Refused: bipartite input",
        _gin,
    ),
    Rule(
        (f"{_G}GINEConv",),
        "twin",
        "`nn((1 + eps) x_i + sum_j ReLU(x_j + lin(e_ji)))` over incoming edges, `eps`, "
        "`train_eps`, `edge_dim` (its `lin`); called with `edge_attr=data.edge_attr` of the "
        "part; its `nn` is converted in turn. Refused: bipartite input, any other `edge_attr`",
        _gine,
    ),
    Rule(
        (f"{_G}GraphConv",),
        "twin",
        "`lin_rel(aggr_j x_j) + lin_root(x_i)` with `aggr='add'` / `'sum'`, `'mean'` or `'max'` "
        "(as `SAGEConv`), `bias`. Refused: `edge_weight` in the call, other aggregations, "
        "bipartite input, `flow`",
        _graphconv,
    ),
    Rule(
        (f"{_G}conv.MessagePassing",),
        "refused",
        "every other message-passing layer (`GATv2Conv`, `PNAConv`, `EdgeConv`, ...)",
        _refuser(_MESSAGE_PASSING),
        exact=False,
    ),
    Rule(
        ("torch.nn.BatchNorm1d", "torch.nn.SyncBatchNorm"),
        "twin",
        "moments over every rank's rows, running statistics as torch. Refused: "
        "`affine=False`, `track_running_stats=False`, `momentum=None`",
        _batch_norm,
        exact=False,
    ),
    Rule(
        ("torch.nn.Dropout",),
        "twin",
        "masks hashed from (seed, step, call index, global node id, column)",
        _dropout,
    ),
    Rule(
        ("torch.nn.modules.dropout._DropoutNd", "torch.nn.RReLU"),
        "refused",
        "`AlphaDropout`, `Dropout1d/2d/3d`, `FeatureAlphaDropout`, `RReLU`: " + _RANDOM,
        _refuser(_RANDOM),
        exact=False,
        label="other dropout modules, `torch.nn.RReLU`",
    ),
    Rule(
        (f"{_G}BatchNorm",),
        "walked",
        "its `BatchNorm1d` is converted. Refused: `allow_single_element=True`",
        _pyg_batch_norm,
    ),
    Rule(
        (f"{_G}LayerNorm",),
        "kept",
        "`mode='node'` (each node on its own). Refused: `mode='graph'` (the default)",
        _pyg_layer_norm,
    ),
    Rule(
        ("torch.nn.LayerNorm", "torch.nn.RMSNorm"),
        "kept",
        "`normalized_shape` the feature width",
        _per_row,
        exact=False,
    ),
    Rule(
        ("torch.nn.Softmax", "torch.nn.Softmin", "torch.nn.LogSoftmax", "torch.nn.GLU"),
        "kept",
        "`dim=-1` or `1`. Refused: `dim=0` (mixes nodes)",
        _softmax,
        exact=False,
    ),
    Rule(
        (f"{_G}MLP",),
        "walked",
        "`dropout` (its `F.dropout` calls are made exact), `norm='batch_norm'` (converted), "
        "`'layer_norm'` with `norm_kwargs={'mode': 'node'}`",
        _walk,
    ),
    Rule(
        (f"{_G}Linear", f"{_G}JumpingKnowledge"),
        "kept",
        "row-wise; `JumpingKnowledge` modes `cat`, `max` and `lstm` (per node)",
        _keep,
        exact=False,
    ),
    Rule(
        tuple(f"torch.nn.{name}" for name in _ROW_WISE),
        "kept",
        "row-wise",
        _keep,
        exact=False,
        label="`torch.nn` `Linear`, `Bilinear`, `Identity`, `GroupNorm` and the activations "
        "(`ReLU`, `ELU`, `GELU`, `LeakyReLU`, `PReLU`, ...)",
    ),
    Rule(
        tuple(f"torch.nn.{name}" for name in _CONTAINERS),
        "walked",
        "containers",
        _walk,
        exact=False,
    ),
    Rule(
        (f"{_G}models.basic_gnn.BasicGNN",),
        "walked",
        "PyG's `GCN`, `GraphSAGE`, `GAT`, `GIN` models with `num_layers`, `out_channels`, "
        "`dropout`, `act`, `act_first`, `norm` (`batch_norm`; `layer_norm` with "
        "`norm_kwargs={'mode': 'node'}`), `jk` (`last`, `cat`, `max`, `lstm`) and their layer's "
        "options above (refused: `GAT(v2=True)`, `PNA`, `EdgeCNN`: their layers have no twin)",
        _walk,
        exact=False,
        label="`torch_geometric.nn.models.GCN`, `GraphSAGE`, `GAT`, `GIN` (any `BasicGNN`)",
    ),
    Rule(
        ("torch_geometric.utils._trim_to_layer.TrimToLayer",),
        "twin",
        "inside every `BasicGNN`: refuses `num_sampled_nodes_per_hop` when called (sampled "
        "subgraphs)",
        _trim,
    ),
    Rule(
        (f"{_G}aggr.Aggregation",),
        "refused",
        "pooling and aggregation over nodes: " + _WHOLE_GRAPH,
        _refuser(f"pooling and aggregation over nodes: {_WHOLE_GRAPH}"),
        exact=False,
    ),
    Rule(
        (),
        "refused",
        "pooling over nodes: " + _WHOLE_GRAPH,
        _refuser(f"pooling and aggregation over nodes: {_WHOLE_GRAPH}"),
        prefix="torch_geometric.nn.pool",
        label="`torch_geometric.nn.pool.*`",
    ),
    Rule(
        (),
        "refused",
        "`GraphNorm`, `InstanceNorm`, `PairNorm`, ...: " + _WHOLE_GRAPH,
        _refuser(_WHOLE_GRAPH),
        prefix="torch_geometric.nn.norm",
        label="other `torch_geometric.nn.norm.*`",
    ),
    Rule(
        (),
        "walked",
        "your own modules (not torch's or PyG's); any other torch or PyG module is refused as "
        "not known to act on every node's row alone",
        _ours,
        label="anything else",
    ),
)


def _lazy(module: nn.Module) -> bool:
    return any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters())


def _twin(path: str, module: nn.Module, c: _Conversion) -> nn.Module | bool:
    """The twin of ``module``, ``True`` to keep it and look at its children, ``False`` to keep
    it as it is.

    Raises:
        ConfigError: ``module`` cannot be distributed exactly (path, class and why).
    """
    if isinstance(module, TWINS) or getattr(module, "_part", None) is c.part:
        return False
    if _lazy(module):
        raise _refuse(path, module, "lazy parameters (in_channels=-1): give the input width")
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


def distribute(model: nn.Module, data: Any, *, precision: str = "32") -> nn.Module:
    """Convert ``model`` in place to compute this rank's rows of what it computes on one process.

    Supported layers are replaced by distributed twins holding the same parameter objects (the
    optimiser keeps working, ``state_dict`` keys stay), every rank takes rank 0's parameters
    and buffers (a collective), and the model is hooked so that
    ``loss.backward()`` ends with the gradients summed over all ranks (one fixed-order
    all-reduce; every rank then holds the one-process gradient). Call the converted model as
    before, ``model(data.x, data.edge_index)``.

    Args:
        model: a PyG model (see :mod:`fullgraph.pyg.convert` for what it may hold).
        data: this rank's part (:func:`fullgraph.pyg.load_part`).
        precision: ``"32"`` (float32), ``"bf16-mixed"`` (the forward pass's weight products
            and aggregations read bfloat16, forward halo rows travel in bfloat16; parameters,
            gradients, optimiser state, loss and the output stay float32:
            :func:`fullgraph.pyg.functional.mixed_linear_call`) or ``"auto"`` (bf16-mixed
            where it pays on the device of ``data.x``, else 32, saying which on rank 0:
            :func:`fullgraph.precision.auto_precision`),
            as ``fullgraph train --precision``. The resolved value is
            ``model.fullgraph_precision``. Every model of one part runs at one precision (the
            part's halo plan carries it).

    Returns:
        The converted model (``model`` itself unless ``model`` is a single supported layer).

    Raises:
        ConfigError: an unknown ``precision``, or ``bf16-mixed`` on a device without bfloat16
            (the line of ``fullgraph train``, before anything is converted), a module that
            cannot be distributed exactly (its path, class and why), each on every rank alike
            when any rank refuses; a model already converted for another part or precision,
            or a part whose models run at another precision.
    """
    part = part_graph_of(data, "fullgraph.pyg.distribute")
    policy = _agreed_precision(part, precision, _device_of(data))
    done = getattr(model, "_fullgraph_run", None)
    if done is not None:
        if done.part is not part:
            raise ConfigError("distribute: the model was already converted for another part")
        if done.precision != policy:
            raise ConfigError(
                f"distribute: the model was already converted at precision "
                f"{done.precision.name!r}, not {policy.name!r}"
            )
        return model
    if part.precision not in (None, policy):
        raise ConfigError(
            f"distribute: precision {policy.name!r}, but this part's models run at "
            f"{part.precision.name!r} (its halo plan carries the precision): convert every "
            f"model of a part at one precision, or load_part again for another"
        )
    conversion = _Conversion(part)

    def convert(module: nn.Module, path: str) -> nn.Module:
        twin = _twin(path, module, conversion)
        if isinstance(twin, nn.Module):
            for name in getattr(twin, "CONVERT_CHILDREN", ()):
                setattr(twin, name, convert(getattr(twin, name), f"{path}.{name}"))
            return twin
        if twin:
            for name, child in list(module.named_children()):
                setattr(module, name, convert(child, f"{path}.{name}"))
        return module

    try:
        model = convert(model, "model")
        refused = None
    except ConfigError as error:
        refused = error
    _agree(part, refused)
    part.set_precision(policy)  # its halo plan, built anew at this precision
    _broadcast_state(model, part)
    model._fullgraph_run = ModelRun(model, part, policy)
    watch(model, data, part)  # the script's own reductions over nodes: exact
    model.fullgraph_precision = policy.name
    return model


def _device_of(data: Any) -> str:
    """The device type of the part's rows (``data.x``), where the products run; ``cpu``
    when ``data`` holds no rows."""
    x = getattr(data, "x", None)
    return x.device.type if isinstance(x, torch.Tensor) else "cpu"


def _agreed_precision(part: PartGraph, requested: object, device: str) -> Precision:
    """``requested`` resolved on ``device`` (:func:`~fullgraph.precision.resolve_precision`)
    and agreed by the ranks (a collective with several): ``auto`` is bf16-mixed only where
    it is on every rank; rank 0 prints the line of an ``auto`` (what it resolved to, why).

    Raises:
        ConfigError: an unknown value, or ``bf16-mixed`` without bfloat16 on some rank (the
            first rank's line in rank order, on every rank alike).
    """
    if requested is None or type(requested) is int:  # None: the default; 32 as Lightning
        requested = "32" if requested is None else str(requested)
    resolved, note, refused = None, None, None
    try:
        resolved, note = resolve_precision(requested, device)  # type: ignore[arg-type]
    except ConfigError as error:
        refused = error
    values = _agree(part, refused, None if resolved is None else resolved.name)
    if "32" in values and resolved != FLOAT32:  # auto, and another rank has no bfloat16
        resolved = FLOAT32
        rank = values.index("32")
        note = f"--precision auto: float32, as on rank {rank} (one precision for every rank)"
    if note is not None and part.comm.rank == 0:
        print(f"fullgraph.pyg: {note}", file=sys.stderr, flush=True)
    assert resolved is not None
    return resolved


def _agree(part: PartGraph, refused: ConfigError | None, value: Any = None) -> list[Any]:
    """Raise alike on every rank when any rank refused (a collective with several ranks);
    else return every rank's ``value``, in rank order.

    Raises:
        ConfigError: the first refusal in rank order, marked ``alike`` (printed once, by rank
            0, by the one-line hook of :func:`fullgraph.pyg.load_part`).
    """
    mine = (None if refused is None else str(refused), value)
    gathered = [mine] if part.comm.size == 1 else part.comm.allgather_object(mine)
    first = next((m for m, _ in gathered if m is not None), None)
    if first is None:
        return [v for _, v in gathered]
    error = refused if refused is not None and str(refused) == first else ConfigError(first)
    error.alike = True  # type: ignore[attr-defined]
    raise error


def _broadcast_state(model: nn.Module, part: PartGraph) -> None:
    """Give every rank rank 0's parameters and buffers (whatever seed each rank used)."""
    if part.comm.size == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            buf = t.detach().cpu().contiguous().clone()
            part.comm.broadcast_(buf, 0)
            t.copy_(buf)
