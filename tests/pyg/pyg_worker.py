"""Worker of ``tests/pyg/test_byo_model.py``: PyG models converted by ``fullgraph.pyg``.

``converted --source SOURCE --group GROUP`` (run by :func:`harness.run_task`, result ``.npz``):
``SOURCE`` is a partition directory, or ``sbm`` (every rank builds the tests' default graph and
``load_part`` partitions it in memory). Every model of ``GROUPS[GROUP]`` is converted and
trained :data:`STEPS` SGD steps, with dropout off (``exact``: compared with the original PyG
model on one process) and on (``dropout``: compared with the converted model on one process);
rank 0 saves the gradients of the first step, the losses, the parameters and buffers after the
last step and the validation accuracy, and whether every rank holds the same parameters.

Groups: ``examples`` (models written by hand: the examples' GCN and GAT as PyG's own examples
write them, ``F.dropout`` calls included; GraphSAGE + BatchNorm; GAT + per-node LayerNorm with
``nn.Dropout``; a linear map whose weight is dropped), ``basic_gnn`` (PyG's model classes
``GCN``, ``GraphSAGE``, ``GAT``, ``GIN`` with their common arguments), ``edges`` (weighted
``GCNConv`` with ``improved``, ``GINEConv`` and ``GATConv`` with ``edge_dim``, on
:func:`edge_graph`; task ``edges --source DIR --transports mpi gloo``) and ``max``
(``GraphSAGE(aggr="max")``, ``GraphConv`` with the maximum and the mean).

``precision --source DIR --precision bf16-mixed`` (:func:`run_precision`): the ``precision``
group (PyG's ``GCN``, ``GraphSAGE``, ``GIN``, ``GAT``) trained 20 Adam epochs with dropout;
``--group precision_edges``: ``GATConv(edge_dim)``, ``GINEConv`` and ``GraphSAGE(aggr="max")``
on a partition of :func:`edge_graph`.

The tests call :func:`run_converted` and :func:`run_original` in-process for the references
(:func:`references`), and :func:`compare` a run with them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from harness import Tasks, Tol, assert_matches_one_process, main
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from gcn_cora import GAT, GCN
from sage_batchnorm import SAGEBatchNorm

from fullgraph import pyg
from fullgraph.models import layer_kinds

STEPS = 3
#: mode -> drop probability (node dropout and GAT attention dropout)
MODES = {"exact": 0.0, "dropout": 0.5}


class GATLayerNorm(nn.Module):
    """``conv2(drop(elu(norm(conv1(x)))))``: GATConv with 2 heads, per-node LayerNorm.

    Args:
        in_channels: input features.
        out_channels: classes.
        p: node and attention dropout.
    """

    def __init__(self, in_channels: int, out_channels: int, p: float) -> None:
        from torch_geometric.nn import GATConv, LayerNorm

        super().__init__()
        self.conv1 = GATConv(in_channels, 8, heads=2, dropout=p)
        self.norm = LayerNorm(16, mode="node")
        self.drop = nn.Dropout(p)
        self.conv2 = GATConv(16, out_channels, heads=1, concat=False, dropout=p)

    def forward(self, x: torch.Tensor, edge_index: Any) -> torch.Tensor:
        """Logits of every node."""
        x = F.elu(self.norm(self.conv1(x, edge_index)))
        return self.conv2(self.drop(x), edge_index)


class DropConnect(nn.Module):
    """``lin(relu(conv(x)))`` whose ``lin`` weight is dropped with ``F.dropout`` (a parameter:
    the same mask on every rank).

    Args:
        in_channels: input features.
        out_channels: classes.
        p: drop probability of the weight.
    """

    def __init__(self, in_channels: int, out_channels: int, p: float) -> None:
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.p = p
        self.conv = GCNConv(in_channels, 16)
        self.lin = nn.Linear(16, out_channels)

    def forward(self, x: torch.Tensor, edge_index: Any) -> torch.Tensor:
        """Logits of every node."""
        h = self.conv(x, edge_index).relu()
        return F.linear(h, F.dropout(self.lin.weight, self.p, self.training), self.lin.bias)


class WeightedGCN(nn.Module):
    """``conv2(drop(relu(conv1(x, w))), w)``: ``GCNConv(improved=True)`` then ``GCNConv``, both
    called with the edge weights.

    Args:
        in_channels: input features.
        out_channels: classes.
        p: node dropout.
    """

    #: The edge values :func:`train` passes after ``edge_index``.
    EDGE_ARGS = ("edge_weight",)

    def __init__(self, in_channels: int, out_channels: int, p: float) -> None:
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.conv1 = GCNConv(in_channels, 16, improved=True)
        self.drop = nn.Dropout(p)
        self.conv2 = GCNConv(16, out_channels)

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: Any) -> torch.Tensor:
        """Logits of every node."""
        x = self.drop(self.conv1(x, edge_index, edge_weight).relu())
        return self.conv2(x, edge_index, edge_weight)


class GINE(nn.Module):
    """Two ``GINEConv(MLP, train_eps=True, edge_dim=3)`` layers reading the edge features.

    Args:
        in_channels: input features.
        out_channels: classes.
        p: node dropout.
    """

    EDGE_ARGS = ("edge_attr",)

    def __init__(self, in_channels: int, out_channels: int, p: float) -> None:
        from torch_geometric.nn import GINEConv

        super().__init__()

        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b))

        self.conv1 = GINEConv(mlp(in_channels, 16), train_eps=True, edge_dim=EDGE_DIM)
        self.drop = nn.Dropout(p)
        self.conv2 = GINEConv(mlp(16, out_channels), train_eps=True, edge_dim=EDGE_DIM)

    def forward(self, x: torch.Tensor, edge_index: Any, edge_attr: Any) -> torch.Tensor:
        """Logits of every node."""
        x = self.drop(self.conv1(x, edge_index, edge_attr).relu())
        return self.conv2(x, edge_index, edge_attr)


class GATEdge(nn.Module):
    """Two ``GATConv(edge_dim=3)`` layers (2 heads concatenated, then 1) with attention dropout.

    Args:
        in_channels: input features.
        out_channels: classes.
        p: node and attention dropout.
    """

    EDGE_ARGS = ("edge_attr",)

    def __init__(self, in_channels: int, out_channels: int, p: float) -> None:
        from torch_geometric.nn import GATConv

        super().__init__()
        self.conv1 = GATConv(in_channels, 8, heads=2, dropout=p, edge_dim=EDGE_DIM)
        self.drop = nn.Dropout(p)
        self.conv2 = GATConv(16, out_channels, concat=False, dropout=p, edge_dim=EDGE_DIM)

    def forward(self, x: torch.Tensor, edge_index: Any, edge_attr: Any) -> torch.Tensor:
        """Logits of every node."""
        x = self.drop(F.elu(self.conv1(x, edge_index, edge_attr)))
        return self.conv2(x, edge_index, edge_attr)


#: Width of the edge feature rows of :func:`edge_graph`.
EDGE_DIM = 3


def edge_graph() -> Any:
    """The tests' default graph with edge weights and :data:`EDGE_DIM` edge features."""
    from conftest import build_sbm_graph

    from fullgraph.datasets.synthetic import with_edge_values

    return with_edge_values(build_sbm_graph(), edge_dim=EDGE_DIM, seed=5)


class GraphConvs(nn.Module):
    """``conv2(drop(relu(conv1(x))))``: ``GraphConv(aggr="max")`` then ``aggr="mean"``.

    Args:
        in_channels: input features.
        out_channels: classes.
        p: node dropout.
    """

    def __init__(self, in_channels: int, out_channels: int, p: float) -> None:
        from torch_geometric.nn import GraphConv

        super().__init__()
        self.conv1 = GraphConv(in_channels, 16, aggr="max")
        self.drop = nn.Dropout(p)
        self.conv2 = GraphConv(16, out_channels, aggr="mean")

    def forward(self, x: torch.Tensor, edge_index: Any) -> torch.Tensor:
        """Logits of every node."""
        return self.conv2(self.drop(self.conv1(x, edge_index).relu()), edge_index)


def _basic_gnn(cls: str, layers: int, **kwargs: Any) -> Callable[[int, int, float], nn.Module]:
    def make(in_channels: int, classes: int, p: float) -> nn.Module:
        import torch_geometric.nn.models as models

        return getattr(models, cls)(in_channels, 16, layers, classes, dropout=p, **kwargs)

    return make


#: Group -> model name -> builder ``(in_channels, classes, p)``.
GROUPS: dict[str, dict[str, Callable[[int, int, float], nn.Module]]] = {
    "examples": {
        "gcn": lambda f, c, p: GCN(f, 16, c, p),
        "sage_bn": lambda f, c, p: SAGEBatchNorm(f, 16, c, p),
        "gat_ln": GATLayerNorm,
        "gat_example": lambda f, c, p: GAT(f, 8, c, heads=2, dropout=p),
        "dropconnect": DropConnect,
    },
    "basic_gnn": {
        "GCN": _basic_gnn("GCN", 2),
        "GCN-jk-cat-bn-elu": _basic_gnn("GCN", 3, jk="cat", norm="batch_norm", act="elu"),
        "GraphSAGE-jk-max-ln": _basic_gnn(
            "GraphSAGE", 2, jk="max", norm="layer_norm", norm_kwargs={"mode": "node"}
        ),
        "GraphSAGE-sum-bn-act-first": _basic_gnn(
            "GraphSAGE", 2, aggr="sum", norm="batch_norm", act_first=True
        ),
        "GAT-heads2": _basic_gnn("GAT", 2, heads=2),
        "GAT-jk-lstm-leaky": _basic_gnn("GAT", 2, heads=2, jk="lstm", act="leaky_relu"),
        "GIN-train-eps": _basic_gnn("GIN", 2, train_eps=True),
        "GIN-jk-last-bn": _basic_gnn("GIN", 3, jk="last", norm="batch_norm"),
    },
    "edges": {"gcn_weighted": WeightedGCN, "gine": GINE, "gat_edge": GATEdge},  # edge_graph()
    "max": {  # the maximum over neighbours (tests/pyg/test_pyg_max.py)
        "GraphSAGE-max": _basic_gnn("GraphSAGE", 2, aggr="max"),
        "GraphConv-max-mean": lambda f, c, p: GraphConvs(f, c, p),
    },
    "precision": {  # PyG's classes at bf16-mixed (tests/pyg/test_pyg_precision.py)
        "GCN": _basic_gnn("GCN", 2),
        "GraphSAGE": _basic_gnn("GraphSAGE", 2),
        "GIN-train-eps": _basic_gnn("GIN", 2, train_eps=True),
        "GAT-heads2": _basic_gnn("GAT", 2, heads=2),
    },
    "adj_t": {  # called with adj_t (T.ToSparseTensor()): tests/pyg/test_pyg_sources.py
        "GCN-improved": _basic_gnn("GCN", 2, improved=True),
        "GAT-heads2": _basic_gnn("GAT", 2, heads=2),
    },
    "adj_t_unweighted": {"GraphSAGE": _basic_gnn("GraphSAGE", 2)},  # refuses a weighted adj_t
    "precision_edges": {  # at bf16-mixed on edge_graph(): edge values, the maximum
        "gat_edge": GATEdge,
        "gine": GINE,
        "GraphSAGE-max": _basic_gnn("GraphSAGE", 2, aggr="max"),
    },
}

#: Models that need the ``gat`` layer kind.
_GAT = ("gat_ln", "gat_example", "GAT-heads2", "GAT-jk-lstm-leaky")


def models(group: str = "examples") -> tuple[str, ...]:
    """The models of ``group`` tested (those with GAT layers where the ``gat`` kind exists)."""
    names = tuple(GROUPS[group])
    return names if "gat" in layer_kinds() else tuple(n for n in names if n not in _GAT)


#: What :func:`run_converted` and :func:`run_original` save of every model, for each mode
FIELDS = ("grads", "losses", "params", "buffers", "val_acc")
#: Equal to rtol 1e-5 (entries near zero: to 1e-5 of the quantity's largest entry).
CLOSE = Tol(rtol=1e-5, atol=1e-5, of_max=True)


def compare(got: dict, want: dict, mode: str, group: str = "examples", where: str = "") -> None:
    """Every :data:`FIELDS` of ``group``'s models run in ``mode`` (``exact``, ``dropout``) in
    ``got`` equal ``want``'s (:data:`CLOSE`); ``where``: the run ``got`` comes from."""
    tolerances = {f"{mode}/{field}": CLOSE for field in FIELDS}
    where = f"{group} models, {mode}" + (f", {where}" if where else "")
    assert_matches_one_process(got, want, tolerances, names=models(group), where=where)


def references(graph: Any, group: str) -> dict:
    """``group``'s original PyG models and the converted ones on one process, on ``graph``:
    ``{"original": ..., "converted": ...}``."""
    from fullgraph.datasets import to_pyg
    from fullgraph.distributed import Communicator

    with torch.random.fork_rng():
        original = run_original(to_pyg(graph), group)
        converted = run_converted(pyg.load_part(graph, Communicator()), group)
    return {"original": original, "converted": converted}


def build(name: str, in_channels: int, classes: int, p: float) -> nn.Module:
    """Model ``name`` (of any group), initialised from seed 0."""
    torch.manual_seed(0)
    make = next(g[name] for g in GROUPS.values() if name in g)
    return make(in_channels, classes, p)


def train(
    model: nn.Module,
    data: Any,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    accuracy: Callable[[torch.Tensor], float],
    *,
    steps: int = STEPS,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    first_output: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, np.ndarray]:
    """``steps`` optimiser steps; first gradients, losses, final parameters, buffers, accuracy.

    The optimiser is SGD with momentum unless ``optimizer`` (called with the parameters) says
    otherwise: SGD is linear in the gradients, while Adam would turn the rounding noise of the
    gradients that are zero in exact arithmetic (a bias before BatchNorm) into full steps.
    ``first_output`` receives the model's output of the first step.
    """
    if optimizer is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    else:
        opt = optimizer(model.parameters())
    out: dict[str, np.ndarray] = {}
    losses = []
    edge_args = [data[k] for k in getattr(model, "EDGE_ARGS", ())]
    for step in range(steps):
        model.train()
        opt.zero_grad()
        output = model(data.x, data.edge_index, *edge_args)
        if step == 0 and first_output is not None:
            first_output(output)
        loss = loss_fn(output)
        loss.backward()
        if step == 0:
            grads = [p.grad.reshape(-1) for p in model.parameters()]
            out["grads"] = torch.cat(grads).detach().numpy().copy()
        opt.step()
        losses.append(loss.item())
    out["losses"] = np.asarray(losses)
    out["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    buffers = [b.reshape(-1).double() for b in model.buffers() if b.dtype.is_floating_point]
    out["buffers"] = torch.cat(buffers).numpy() if buffers else np.zeros(0)
    model.eval()
    with torch.no_grad():
        out["val_acc"] = np.asarray(accuracy(model(data.x, data.edge_index, *edge_args)))
    return out


def run_converted(data: Any, group: str = "examples") -> dict[str, np.ndarray]:
    """Every model of ``group`` and mode converted for ``data`` (a part from ``load_part``)."""
    results: dict[str, np.ndarray] = {}
    for name in models(group):
        for mode, p in MODES.items():
            model = pyg.distribute(build(name, data.num_features, data.num_classes, p), data)
            got = train(
                model,
                data,
                lambda out: pyg.loss(out, data),
                lambda out: pyg.accuracy(out, data, data.val_mask),
            )
            params = data.fullgraph.comm.allgather_object(got["params"].tobytes())
            got["same_on_every_rank"] = np.asarray(len(set(params)) == 1)
            results.update({f"{name}/{mode}/{k}": v for k, v in got.items()})
    return results


def run_original(data: Any, group: str = "examples") -> dict[str, np.ndarray]:
    """Every model of ``group`` unconverted, dropout off, on the whole PyG ``data``."""
    results: dict[str, np.ndarray] = {}
    m = data.train_mask

    def accuracy(out: torch.Tensor) -> float:
        v = data.val_mask
        return float((out.argmax(-1)[v] == data.y[v]).sum()) / float(v.sum())

    for name in models(group):
        model = build(name, data.num_features, data.num_classes, 0.0)
        got = train(model, data, lambda out: F.cross_entropy(out[m], data.y[m]), accuracy)
        results.update({f"{name}/exact/{k}": v for k, v in got.items()})
    return results


#: Epochs of :func:`run_precision` and the node dropout of its models.
PRECISION_EPOCHS, PRECISION_DROPOUT = 20, 0.5


def gather_rows(rows: torch.Tensor, data: Any) -> np.ndarray:
    """Every rank's ``rows`` (one per inner node) in global node order, on every rank (a
    collective)."""
    pg = data.fullgraph
    pieces = pg.comm.allgather_object((pg.global_ids, rows.detach().cpu().numpy()))
    out = np.zeros((sum(len(ids) for ids, _ in pieces), rows.shape[1]), dtype=np.float64)
    for ids, values in pieces:
        out[ids] = values
    return out


def run_precision(
    data: Any, precision: str, group: str = "precision", epochs: int = PRECISION_EPOCHS
) -> dict[str, np.ndarray]:
    """The models of ``group`` converted at ``precision`` and trained ``epochs`` Adam steps
    with dropout: step-1 logits (global order), losses, the recorded precision and the dtypes
    the forward halo rows were sent in."""
    sent: set[str] = set()
    recorded: list[Any] = []

    def record(plan: Any) -> None:
        """Record the dtypes ``plan`` (the part's, built at its precision by ``distribute``)
        sends its forward rows in; this plan only."""
        if any(plan is p for p in recorded):
            return
        start_forward = plan.start_forward

        def recording(h: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            sent.add(str(h.dtype))
            return start_forward(h, *args, **kwargs)

        plan.start_forward = recording
        recorded.append(plan)

    results: dict[str, np.ndarray] = {}
    for name in models(group):
        sent.clear()
        model = build(name, data.num_features, data.num_classes, PRECISION_DROPOUT)
        model = pyg.distribute(model, data, precision=precision)
        record(data.fullgraph.plan)

        def first(out: torch.Tensor, name: str = name) -> None:
            results[f"{name}/logits"] = gather_rows(out, data)
            results[f"{name}/output_dtype"] = np.asarray(str(out.dtype))

        got = train(
            model,
            data,
            lambda out: pyg.loss(out, data),
            lambda out: pyg.accuracy(out, data, data.val_mask),
            steps=epochs,
            optimizer=lambda params: torch.optim.Adam(params, lr=0.01, weight_decay=5e-4),
            first_output=first,
        )
        results[f"{name}/losses"] = got["losses"]
        results[f"{name}/precision"] = np.asarray(model.fullgraph_precision)
        results[f"{name}/halo_dtypes"] = np.asarray(",".join(sorted(sent)))
    return results


TASKS = Tasks()


@TASKS.task
def converted(*, source: str, group: str = "examples") -> dict[str, np.ndarray]:
    """:func:`run_converted` of ``group`` on the part of ``source`` (a partition directory, or
    ``sbm``)."""
    if source == "sbm":
        from conftest import build_sbm_graph

        data = pyg.load_part(build_sbm_graph(), threads=1)
    else:
        data = pyg.load_part(source, threads=1)
    return run_converted(data, group)


@TASKS.task
def edges(*, source: str, transports: list[str]) -> dict[str, np.ndarray]:
    """:func:`run_converted` of the ``edges`` group on the part of ``source`` (a partition of
    :func:`edge_graph`, or ``graph``: the whole graph on one rank) over each transport."""
    from harness import communicators

    results: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        data = pyg.load_part(edge_graph() if source == "graph" else source, comm)
        got = run_converted(data, "edges")
        results.update({f"{transport}/{k}": v for k, v in got.items()})
    return results


@TASKS.task
def precision(*, source: Path, precision: str, group: str = "precision") -> dict[str, np.ndarray]:
    """:func:`run_precision` of ``group`` at ``precision`` on the part of partition directory
    ``source``."""
    return run_precision(pyg.load_part(source, threads=1), precision, group)


def with_adj_t(data: Any) -> Any:
    """``data`` (a whole PyG graph, or a part) with ``edge_index`` replaced by its ``adj_t``:
    :func:`train` then calls every model as a script written for ``T.ToSparseTensor()`` does,
    ``model(data.x, data.adj_t)``."""
    import copy

    view = copy.copy(data)
    view.edge_index = data.adj_t
    return view


def adj_t_graph(weighted: bool) -> Any:
    """The tests' default graph (with edge weights: :func:`edge_graph`'s, no features) after
    ``T.ToSparseTensor()``: ``adj_t`` instead of ``edge_index``."""
    import torch_geometric.transforms as T
    from conftest import build_sbm_graph

    from fullgraph.datasets import to_pyg

    graph = edge_graph() if weighted else build_sbm_graph()
    graph.edge_attr = None
    return T.ToSparseTensor()(to_pyg(graph))


@TASKS.task
def adj_t(*, source: str, weighted: int = 0) -> dict[str, np.ndarray]:
    """:func:`run_converted` of the ``adj_t`` group called with ``data.adj_t``, the part of
    ``source``: ``graph`` (every rank holds :func:`adj_t_graph`, ``load_part`` partitions it)
    or a partition directory."""
    data = pyg.load_part(adj_t_graph(bool(weighted)) if source == "graph" else source, threads=1)
    return run_converted(with_adj_t(data), "adj_t")


#: The arrays of a part that :func:`part_arrays` returns.
PART_ARRAYS = ("global_ids", "indptr", "indices", "send_index", "send_offsets", "recv_offsets")


@TASKS.task
def part_arrays(*, source: str, adj: int = 0) -> dict[str, np.ndarray]:
    """Every rank's part arrays (:data:`PART_ARRAYS`, ``edge_weight``) of ``load_part(source)``
    as ``r/name``: ``graph`` (every rank holds :func:`adj_t_graph` of the weighted graph and
    ``load_part`` partitions it; ``--adj 0``: its ``edge_index`` form) or a partition
    directory."""
    if source == "graph":
        whole = adj_t_graph(True) if adj else _weighted_only()
        data = pyg.load_part(whole, threads=1)
    else:
        data = pyg.load_part(source, threads=1)
    part = data.fullgraph.part
    mine = {k: np.asarray(getattr(part, k)) for k in PART_ARRAYS}
    mine["edge_weight"] = np.asarray(part.edge_weight)
    out = {}
    for r, arrays in enumerate(data.fullgraph.comm.allgather_object(mine)):
        out.update({f"{r}/{k}": v for k, v in arrays.items()})
    return out


def _weighted_only() -> Any:
    """:func:`edge_graph` as a PyG ``Data`` with its edge weights and no edge features."""
    from fullgraph.datasets import to_pyg

    graph = edge_graph()
    graph.edge_attr = None
    return to_pyg(graph)


#: Where :func:`stall` stops a rank: before the first collective after ``load_part``, after
#: epoch 3, or between the forward pass and the loss of epoch 3; ``raise``: it raises a
#: ``ValueError`` (a bug in the script) after epoch 3.
STALLS = ("before", "epoch", "loss", "raise")


@TASKS.task
def stall(*, where: str, transport: str = "auto", timeout: float = 5.0) -> dict[str, np.ndarray]:
    """A user's training script whose rank 1 stalls in its own code (``time.sleep``) at
    ``where`` (:data:`STALLS`); the job must end with one line within about ``timeout``."""
    import time

    from conftest import build_sbm_graph

    data = pyg.load_part(build_sbm_graph(), threads=1, timeout=timeout, transport=transport)
    stalls = data.fullgraph.comm.rank == 1
    if stalls and where == "before":
        time.sleep(3600)
    model = pyg.distribute(build("gcn", data.num_features, data.num_classes, 0.5), data)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(1, 6):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        if stalls and where == "loss" and epoch == 3:
            time.sleep(3600)
        loss = pyg.loss(out, data)
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
        if stalls and where == "epoch" and epoch == 3:
            time.sleep(3600)
        if stalls and where == "raise" and epoch == 3:
            raise ValueError("a bug in the script on rank 1")
    return {"finished": np.asarray(True)}


#: What :func:`load_wrong` passes to ``load_part``.
WRONG = ("int", "missing", "no_y")


@TASKS.task
def load_wrong(*, what: str) -> dict[str, np.ndarray]:
    """``load_part`` of a wrong thing (:data:`WRONG`) on every rank: one line, every rank ends."""
    from conftest import build_sbm_graph

    from fullgraph.datasets import to_pyg

    no_y = to_pyg(build_sbm_graph())
    del no_y.y
    source = {"int": 42, "missing": "parts/not-there-4", "no_y": no_y}[what]
    pyg.load_part(source, threads=1, timeout=20)
    return {"loaded": np.asarray(True)}


if __name__ == "__main__":
    sys.exit(main(TASKS))
