"""The aggregations of ``sage`` and ``graphconv`` (``--aggr mean|sum|max``) against PyG.

Each layer's output and gradients equal PyG's ``SAGEConv(aggr=...)`` / ``GraphConv(aggr=...)``
with the same weights to 1e-6 in float64 on a graph with isolated nodes and a hub, and so do
the ``fullgraph.pyg`` twins of those PyG layers; a whole model's losses over 5 epochs equal a
plain PyG model's; the options are checked.

Enters through :mod:`fullgraph.models.layers.sage` and :mod:`fullgraph.models.layers.graphconv`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn")

from side_by_side import PygStack, losses_side_by_side  # noqa: E402
from test_pyg_parity import _hub_graph  # noqa: E402

from fullgraph import pyg  # noqa: E402
from fullgraph.datasets import Graph, to_pyg  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.distributed.halo import HaloPlan  # noqa: E402
from fullgraph.errors import ConfigError  # noqa: E402
from fullgraph.models import GraphContext, layer_class  # noqa: E402
from fullgraph.models.layers import LayerOptions  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.training import RunOptions, TrainConfig, Trainer  # noqa: E402
from fullgraph.training.assembly import needs_structure, rank_context  # noqa: E402

#: (kind, aggr, PyG's class, PyG's aggr, PyG's names of our ``lin`` and ``root``)
KINDS = [
    ("sage", "mean", "SAGEConv", "mean", ("lin_l", "lin_r")),
    ("sage", "sum", "SAGEConv", "sum", ("lin_l", "lin_r")),
    ("sage", "max", "SAGEConv", "max", ("lin_l", "lin_r")),
    ("graphconv", "sum", "GraphConv", "add", ("lin_rel", "lin_root")),
    ("graphconv", "mean", "GraphConv", "mean", ("lin_rel", "lin_root")),
    ("graphconv", "max", "GraphConv", "max", ("lin_rel", "lin_root")),
]
IDS = [f"{k}-{a}" for k, a, *_ in KINDS]


@pytest.fixture(scope="module")
def graph() -> Graph:
    from conftest import build_sbm_graph

    return _hub_graph(lambda **kw: build_sbm_graph(**kw))


def _context(graph: Graph, kind: str, aggr: str) -> GraphContext:
    """The one-process context of ``kind`` with ``aggr``, the operator in float64 (rows in
    global order, as PyG's)."""
    part = whole_graph_part(graph, order="global")
    plan = HaloPlan.from_partition(part, Communicator())
    options = LayerOptions(aggr=aggr)
    return rank_context(part, plan, kind, 0, "cpu", torch.float64, options=options)


def _pyg_layer(spec: tuple, ours: torch.nn.Module) -> torch.nn.Module:
    """PyG's layer of ``spec`` holding our layer's weights."""
    _, _, cls, aggr, (lin, root) = spec
    ref = getattr(pyg_nn, cls)(ours.in_dim, ours.out_dim, aggr=aggr).to(ours.lin.weight.dtype)
    getattr(ref, lin).weight.data.copy_(ours.lin.weight.data)
    getattr(ref, lin).bias.data.copy_(ours.lin.bias.data)
    getattr(ref, root).weight.data.copy_(ours.root.weight.data)
    return ref


def _pyg_grads(spec: tuple, ref: torch.nn.Module) -> list[torch.Tensor]:
    lin, root = (getattr(ref, name) for name in spec[4])
    return [lin.weight.grad, lin.bias.grad, root.weight.grad]


@pytest.mark.parametrize("spec", KINDS, ids=IDS)
@pytest.mark.parametrize("widths", [(16, 8), (8, 16)])  # transform first, aggregate first
def test_layer_equals_pyg(graph: Graph, spec: tuple, widths: tuple[int, int]) -> None:
    kind, aggr = spec[:2]
    torch.manual_seed(0)
    d_in, d_out = widths
    x = torch.randn(graph.num_nodes, d_in, dtype=torch.float64)
    options = LayerOptions(aggr=aggr)
    ours = layer_class(kind).build(d_in, d_out, last=False, options=options).double()
    assert ours.aggr == aggr
    ref = _pyg_layer(spec, ours)
    edge_index = to_pyg(graph).edge_index
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = ours(xa, _context(graph, kind, aggr))
    want = ref(xb, edge_index)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    for a, b in zip([p.grad for p in ours.parameters()], _pyg_grads(spec, ref), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


TWINS = [
    ("SAGEConv", "max"),
    ("GraphConv", "add"),
    ("GraphConv", "sum"),
    ("GraphConv", "mean"),
    ("GraphConv", "max"),
]


@pytest.mark.parametrize(("cls", "aggr"), TWINS, ids=[f"{c}-{a}" for c, a in TWINS])
@pytest.mark.parametrize("widths", [(10, 6), (10, 24)])
def test_pyg_twin_equals_the_pyg_layer(graph: Graph, cls: str, aggr: str, widths) -> None:
    torch.manual_seed(0)
    d_in, d_out = widths
    ref = getattr(pyg_nn, cls)(d_in, d_out, aggr=aggr).double()
    data = pyg.load_part(graph, Communicator())
    twin = pyg.distribute(getattr(pyg_nn, cls)(d_in, d_out, aggr=aggr).double(), data)
    twin.load_state_dict(ref.state_dict())
    assert type(twin).__name__ == f"{cls}Twin"
    x = torch.randn(graph.num_nodes, d_in, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = twin(xa, data.edge_index)
    want = ref(xb, to_pyg(graph).edge_index)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(twin.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("spec", [s for s in KINDS if s[1] != "mean"], ids=lambda s: s[0] + s[1])
def test_model_losses_equal_a_plain_pyg_model(graph: Graph, spec: tuple) -> None:
    """Five Adam epochs from the same weights, no dropout, weight decay on the first layer."""
    kind, aggr = spec[:2]
    cfg = TrainConfig(
        model=kind, aggr=aggr, layers=2, hidden=16, dropout=0.0, lr=0.01, epochs=5, seed=1
    )
    tr = Trainer(whole_graph_part(graph), Communicator(), cfg, RunOptions(quiet=True))
    ref = PygStack(_pyg_layer(spec, layer) for layer in tr.model.layers)
    ours, theirs = losses_side_by_side(tr, ref, graph)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_max_stacks_read_the_edges_and_nothing_else() -> None:
    """A max stack has no operator to precompute or prune; mean and sum keep theirs."""
    for kind in ("sage", "graphconv"):
        assert needs_structure(kind, LayerOptions(aggr="max"))
        assert not needs_structure(kind, LayerOptions(aggr="sum"))
        assert not layer_class(kind).variant(LayerOptions(aggr="max")).prunable
    assert layer_class("sage").variant(None).aggr == "mean"
    assert layer_class("graphconv").variant(None).aggr == "sum"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "gcn", "aggr": "max"}, "--aggr applies to --model sage and graphconv only"),
        ({"model": "sage", "aggr": "min"}, "--aggr must be one of mean, sum, max"),
        (
            {"model": "sage", "aggr": "max", "precompute_first": "on", "input_dropout": 0.0},
            "cannot precompute",
        ),
    ],
)
def test_bad_options_are_refused(fields: dict, message: str, small_graph) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg = TrainConfig(**fields)
        Trainer(whole_graph_part(small_graph), Communicator(), cfg, RunOptions(quiet=True))
