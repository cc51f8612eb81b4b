"""Converting a PyG model for a rank's part: :func:`distribute`.

Every module of the model is looked at, from the root down, and either

- replaced by its distributed twin (:mod:`fullgraph.pyg.twins`) holding the same parameters:
  ``GCNConv``, ``SAGEConv(aggr="mean")``, ``GATConv`` (when the ``gat`` layer kind exists),
  ``torch.nn.BatchNorm1d`` (also the one inside PyG's ``BatchNorm``), ``torch.nn.Dropout``;
- kept, because it acts on every node's row alone, which is exact on any number of ranks:
  ``Linear`` (torch or PyG), activations, ``LayerNorm`` per node (torch, PyG ``mode="node"``),
  ``GroupNorm``, ``RMSNorm``, PyG ``MLP`` without dropout, ``JumpingKnowledge``, containers, and
  the user's own modules (whose children are looked at in turn);
- or refused with a :class:`~fullgraph.errors.ConfigError` naming its path and class and why:
  any other message-passing layer, normalisation or pooling over a whole graph, torch's random
  draws, modules not known to act on rows alone.

The user's own ``forward`` code is not inspected: it must treat nodes row by row (no
``x.mean(dim=0)``, no global pooling) and draw its dropout with :func:`fullgraph.pyg.dropout`
(a training pass that draws from torch's generator is refused when it ends).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.models.layers import layer_kinds
from fullgraph.pyg.part_data import PartGraph, part_graph_of
from fullgraph.pyg.runtime import ModelRun
from fullgraph.pyg.twins import (
    BatchNormTwin,
    GCNConvTwin,
    HashedDropout,
    SAGEConvTwin,
    gat_twin_class,
)

#: Twins already in a model (a second conversion keeps them).
TWINS = (GCNConvTwin, SAGEConvTwin, BatchNormTwin, HashedDropout)

#: torch modules kept as they are: they act on every row alone.
_ROW_WISE = (
    nn.Linear,
    nn.Bilinear,
    nn.Identity,
    nn.Sequential,
    nn.ModuleList,
    nn.ModuleDict,
    nn.GroupNorm,
    nn.Threshold,
    nn.ReLU,
    nn.Hardtanh,
    nn.ReLU6,
    nn.Sigmoid,
    nn.Hardsigmoid,
    nn.Tanh,
    nn.SiLU,
    nn.Mish,
    nn.Hardswish,
    nn.ELU,
    nn.CELU,
    nn.SELU,
    nn.GELU,
    nn.Hardshrink,
    nn.LeakyReLU,
    nn.LogSigmoid,
    nn.Softplus,
    nn.Softshrink,
    nn.PReLU,
    nn.Softsign,
    nn.Tanhshrink,
)

_MESSAGE_PASSING = (
    "fullgraph has distributed twins of GCNConv, SAGEConv(aggr='mean') and GATConv only; "
    "another message-passing layer cannot be split across ranks exactly"
)
_WHOLE_GRAPH = "its statistics are taken over all nodes of a graph at once"


def _refuse(path: str, module: nn.Module, why: str) -> ConfigError:
    cls = type(module)
    return ConfigError(
        f"{path} ({cls.__module__}.{cls.__qualname__}) cannot be distributed exactly: {why}"
    )


def _is_ours(module: nn.Module) -> bool:
    """A module the user defined (not torch's or PyG's): kept, its children looked at."""
    name = type(module).__module__
    return not (name.startswith("torch.") or name.startswith("torch_geometric."))


def _gcn(path: str, conv: nn.Module, part: PartGraph) -> nn.Module:
    for what, bad in (
        ("improved=True", conv.improved),
        ("normalize=False", not conv.normalize),
        ("add_self_loops=False", not conv.add_self_loops),
        (f"aggr={conv.aggr!r}", conv.aggr != "add"),
        (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
    ):
        if bad:
            raise _refuse(path, conv, f"{what} is not supported (the twin is Kipf-Welling GCN)")
    return GCNConvTwin(conv, part)


def _sage(path: str, conv: nn.Module, part: PartGraph) -> nn.Module:
    if conv.aggr != "mean":
        raise _refuse(path, conv, f"aggr={conv.aggr!r}: only the mean aggregation has a twin")
    if conv.flow != "source_to_target":
        raise _refuse(path, conv, f"flow={conv.flow!r} is not supported")
    return SAGEConvTwin(conv, part)


def _gat(path: str, conv: nn.Module, part: PartGraph, index: int) -> nn.Module:
    if "gat" not in layer_kinds():
        raise _refuse(path, conv, "fullgraph has no gat layer kind in this installation")
    from fullgraph.models.layers.gat import NEGATIVE_SLOPE

    for what, bad in (
        ("bipartite input (a tuple of in_channels)", conv.lin is None),
        ("edge_dim (edge features)", conv.edge_dim is not None),
        ("add_self_loops=False", not conv.add_self_loops),
        (f"negative_slope={conv.negative_slope}", conv.negative_slope != NEGATIVE_SLOPE),
        (f"aggr={conv.aggr!r}", conv.aggr != "add"),
        (f"flow={conv.flow!r}", conv.flow != "source_to_target"),
    ):
        if bad:
            raise _refuse(path, conv, f"{what} is not supported by the gat layer kind")
    return gat_twin_class()(conv, part, index)


def _batch_norm(path: str, bn: nn.Module, part: PartGraph) -> nn.Module:
    if not bn.affine:
        raise _refuse(path, bn, "affine=False is not supported (give it affine parameters)")
    if not bn.track_running_stats:
        raise _refuse(path, bn, "track_running_stats=False is not supported")
    if bn.momentum is None:
        raise _refuse(path, bn, "momentum=None (cumulative average) is not supported")
    return BatchNormTwin(bn, part)


def _per_row_shape(path: str, norm: nn.Module) -> None:
    if len(norm.normalized_shape) != 1:
        raise _refuse(path, norm, "normalized_shape must be the feature width alone")


def _twin(path: str, module: nn.Module, part: PartGraph, gat_count: list[int]) -> Any:
    """The twin of ``module``, ``True`` to keep it and look at its children, ``False`` to keep
    it as it is.

    Raises:
        ConfigError: ``module`` cannot be distributed exactly (path, class and why).
    """
    from torch_geometric.nn import MLP, GATConv, GCNConv, JumpingKnowledge, SAGEConv
    from torch_geometric.nn import BatchNorm as PygBatchNorm
    from torch_geometric.nn import LayerNorm as PygLayerNorm
    from torch_geometric.nn import Linear as PygLinear
    from torch_geometric.nn.aggr import Aggregation
    from torch_geometric.nn.conv import MessagePassing
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    if isinstance(module, TWINS) or getattr(module, "_part", None) is part:
        return False
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters()):
        raise _refuse(path, module, "lazy parameters (in_channels=-1): give the input width")
    if type(module) is GCNConv:
        return _gcn(path, module, part)
    if type(module) is SAGEConv:
        return _sage(path, module, part)
    if type(module) is GATConv:
        gat_count[0] += 1
        return _gat(path, module, part, gat_count[0] - 1)
    if isinstance(module, MessagePassing):
        raise _refuse(path, module, _MESSAGE_PASSING)
    if isinstance(module, (nn.BatchNorm1d, nn.SyncBatchNorm)):
        return _batch_norm(path, module, part)
    if type(module) is nn.Dropout:
        if not 0.0 <= module.p < 1.0:
            raise _refuse(path, module, f"p={module.p}: the drop probability must be below 1")
        return HashedDropout(module.p)
    if isinstance(module, nn.modules.dropout._DropoutNd) or isinstance(module, nn.RReLU):
        raise _refuse(path, module, "its random draws are not keyed by node: use nn.Dropout")
    if type(module) is PygBatchNorm:
        if module.allow_single_element:
            raise _refuse(path, module, "allow_single_element=True is not supported")
        return True
    if type(module) is PygLayerNorm:
        if module.mode != "node":
            raise _refuse(
                path,
                module,
                f"mode={module.mode!r}: {_WHOLE_GRAPH}; use mode='node' (each node on its own)",
            )
        return False
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        _per_row_shape(path, module)
        return False
    if isinstance(module, (nn.Softmax, nn.Softmin, nn.LogSoftmax, nn.GLU)):
        if module.dim not in (None, -1, 1):
            raise _refuse(path, module, f"dim={module.dim} mixes nodes (use dim=-1)")
        return False
    if type(module) is MLP:
        if any(p > 0 for p in module.dropout):
            raise _refuse(
                path, module, "its dropout draws from torch's generator: build it with dropout=0"
            )
        return True
    if isinstance(module, (PygLinear, JumpingKnowledge)) or isinstance(module, _ROW_WISE):
        return isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict))
    if isinstance(module, BasicGNN):
        return True
    if isinstance(module, Aggregation) or type(module).__module__.startswith(
        "torch_geometric.nn.pool"
    ):
        raise _refuse(path, module, f"pooling and aggregation over nodes: {_WHOLE_GRAPH}")
    if type(module).__module__.startswith("torch_geometric.nn.norm"):
        raise _refuse(path, module, _WHOLE_GRAPH)
    if _is_ours(module):
        return True
    raise _refuse(path, module, "not known to act on every node's row alone")


def distribute(model: nn.Module, data: Any) -> nn.Module:
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

    Returns:
        The converted model (``model`` itself unless ``model`` is a single supported layer).

    Raises:
        ConfigError: a module that cannot be distributed exactly (its path, class and why), or
            a model already converted for another part.
    """
    part = part_graph_of(data, "fullgraph.pyg.distribute")
    done = getattr(model, "_fullgraph_run", None)
    if done is not None:
        if done.part is not part:
            raise ConfigError("distribute: the model was already converted for another part")
        return model
    gat_count = [0]

    def walk(module: nn.Module, path: str) -> None:
        for name, child in list(module.named_children()):
            where = f"{path}.{name}"
            twin = _twin(where, child, part, gat_count)
            if isinstance(twin, nn.Module):
                setattr(module, name, twin)
            elif twin:
                walk(child, where)

    root = _twin("model", model, part, gat_count)
    if isinstance(root, nn.Module):
        model = root
    elif root:
        walk(model, "model")
    _broadcast_state(model, part)
    model._fullgraph_run = ModelRun(model, part)
    return model


def _broadcast_state(model: nn.Module, part: PartGraph) -> None:
    """Give every rank rank 0's parameters and buffers (whatever seed each rank used)."""
    if part.comm.size == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            buf = t.detach().cpu().contiguous().clone()
            part.comm.broadcast_(buf, 0)
            t.copy_(buf)
