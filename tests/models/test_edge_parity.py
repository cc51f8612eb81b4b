"""The layers that use edge values against PyG, float64, one process, 1e-6.

The ``gcn`` layer kind with the part's edge weights and / or ``improved`` equals
``GCNConv(improved=...)(x, edge_index, edge_weight)``; the ``fullgraph.pyg`` twins of
``GCNConv`` (weights, ``improved``) and ``GINEConv`` (``train_eps``, ``edge_dim``) equal the
original layers, and so does ``GATConv(edge_dim=...)`` (the edge term, the self-loops' features
filled with the mean of the row's in-edge features, a number or their sum). Output, input
gradient and every parameter gradient, on a random graph with
isolated nodes and a hub. (P ranks against one process: ``tests/pyg/test_pyg_edge_values.py``,
``tests/training/test_train_edge_weight.py``.)

Enters through :mod:`fullgraph.models.layers`.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_pyg_parity import _hub_graph

pyg_nn = pytest.importorskip("torch_geometric.nn")

from fullgraph import pyg  # noqa: E402
from fullgraph.datasets import Graph, to_pyg  # noqa: E402
from fullgraph.datasets.synthetic import with_edge_values  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.distributed.halo import HaloPlan, SplitOperator  # noqa: E402
from fullgraph.errors import ConfigError  # noqa: E402
from fullgraph.models import GraphContext, layer_class  # noqa: E402
from fullgraph.models.layers import LayerOptions  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.training.assembly import build_operator  # noqa: E402

TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture(scope="module")
def hub(make_graph) -> Graph:
    return with_edge_values(_hub_graph(make_graph), edge_dim=4, seed=3)


def _backward_and_compare(got, want, xa, xb, ours, ref) -> float:
    """Outputs, input gradients and parameter gradients equal; returns the largest error."""
    torch.testing.assert_close(got, want, **TOL)
    w = torch.randn_like(got)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, **TOL)
    errors = [float((got - want).detach().abs().max()), float((xa.grad - xb.grad).abs().max())]
    for (name, a), b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
        errors.append(float((a.grad - b.grad).abs().max()))
    return max(errors)


@pytest.mark.parametrize("widths", [(16, 8), (8, 16)])
@pytest.mark.parametrize(("edge_weight", "improved"), [(True, False), (True, True), (False, True)])
def test_gcn_kind_equals_pyg(hub: Graph, edge_weight, improved, widths) -> None:
    torch.manual_seed(0)
    d_in, d_out = widths
    part = whole_graph_part(hub, order="global")  # rows in PyG's order
    op = build_operator(part, "gcn", LayerOptions(edge_weight=edge_weight, improved=improved))
    ctx = GraphContext(
        op=SplitOperator(op.inner.with_values(op.inner.values.double()), None),
        plan=HaloPlan.from_partition(part, Communicator()),
        global_ids=np.arange(hub.num_nodes, dtype=np.int64),
        seed=0,
    )
    ours = layer_class("gcn")(d_in, d_out).double()
    ref = pyg_nn.GCNConv(d_in, d_out, improved=improved).double()
    ref.lin.weight.data.copy_(ours.lin.weight.data)
    ref.bias.data.copy_(ours.lin.bias.data)
    data = to_pyg(hub)
    # without weights, PyG's GCNConv ignores improved (2.8): ones make it fill the loops with 2
    weight = data.edge_weight.double() if edge_weight else torch.ones(hub.num_edges).double()
    x = torch.randn(hub.num_nodes, d_in, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got, want = ours(xa, ctx), ref(xb, data.edge_index, weight)
    err = _backward_and_compare(
        got, want, xa, xb, ours.named_parameters(), [ref.lin.weight, ref.bias]
    )
    print(f"gcn edge_weight={edge_weight} improved={improved} {widths}: max abs error {err:.2e}")


def _gine(d_in: int, d_out: int, edge_dim: int | None) -> torch.nn.Module:
    mlp = torch.nn.Sequential(
        torch.nn.Linear(d_in, d_out), torch.nn.ReLU(), torch.nn.Linear(d_out, d_out)
    )
    conv = pyg_nn.GINEConv(mlp, train_eps=True, edge_dim=edge_dim)
    conv.eps.data.fill_(0.3)  # non-zero: its gradient and the root term are checked
    return conv


CONVS = {
    "GCNConv-weighted": (lambda: pyg_nn.GCNConv(12, 8), "edge_weight"),
    "GCNConv-improved-weighted": (lambda: pyg_nn.GCNConv(12, 20, improved=True), "edge_weight"),
    "GCNConv-improved": (lambda: pyg_nn.GCNConv(12, 8, improved=True), None),
    "GINEConv-edge_dim": (lambda: _gine(12, 8, 4), "edge_attr"),
    "GINEConv": (lambda: _gine(4, 8, None), "edge_attr"),  # edge rows as wide as x
    "GATConv-edge_dim": (lambda: pyg_nn.GATConv(12, 8, heads=2, edge_dim=4), "edge_attr"),
    "GATConv-edge_dim-mean-res-fill": (
        lambda: pyg_nn.GATConv(
            12, 8, heads=3, concat=False, edge_dim=4, residual=True, fill_value=0.5
        ),
        "edge_attr",
    ),
    "GATConv-edge_dim-add-slope": (
        lambda: pyg_nn.GATConv(12, 8, edge_dim=4, fill_value="add", negative_slope=0.1),
        "edge_attr",
    ),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_twins_equal_pyg(hub: Graph, name: str) -> None:
    make, edge_arg = CONVS[name]
    torch.manual_seed(0)
    ref = make().double()
    full = to_pyg(hub)
    data = pyg.load_part(hub, Communicator())
    ours = pyg.distribute(copy.deepcopy(ref), data)
    width = 4 if name == "GINEConv" else 12
    x = torch.randn(hub.num_nodes, width, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    if edge_arg is None:
        got, want = ours(xa, data.edge_index), ref(xb, full.edge_index)
    else:
        got = ours(xa, data.edge_index, data[edge_arg].double())
        want = ref(xb, full.edge_index, full[edge_arg].double())
    err = _backward_and_compare(got, want, xa, xb, ours.named_parameters(), ref.parameters())
    print(f"{name}: max abs error {err:.2e}")


def test_twins_refuse_edge_values_not_of_the_part(hub: Graph, small_graph: Graph) -> None:
    data = pyg.load_part(hub, Communicator())
    conv = pyg.distribute(pyg_nn.GCNConv(10, 4), data)
    x = data.x
    with pytest.raises(ConfigError, match="edge_weight differs from data.edge_weight"):
        conv(x, data.edge_index, data.edge_weight.flip(0))
    with pytest.raises(ConfigError, match=r"edge_weight must be data.edge_weight .* got \(3,\)"):
        conv(x, data.edge_index, torch.ones(3))
    gine = pyg.distribute(_gine(10, 4, 4), data)
    with pytest.raises(ConfigError, match="edge_attr is required"):
        gine(x, data.edge_index)
    plain = pyg.load_part(small_graph, Communicator())
    conv = pyg.distribute(pyg_nn.GCNConv(small_graph.num_features, 4), plain)
    with pytest.raises(ConfigError, match="edge_weight was given but the part stores none"):
        conv(plain.x, plain.edge_index, torch.ones(plain.edge_index.num_edges))
