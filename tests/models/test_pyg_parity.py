"""Every layer kind against PyG, the outside reference, on one process.

The exactness tests compare P ranks with one process of our own code; a formula wrong the same
way everywhere would pass them. Here each layer's output and gradients equal PyG's ``GCNConv`` /
``SAGEConv(aggr="mean")`` / ``GINConv(Linear-ReLU-Linear, train_eps=True)`` with the same
weights to 1e-6 in float64 (on Cora and on a random graph with isolated nodes and a hub), and the
whole model's loss over 5 epochs equals a plain PyG model's trained from the same initial weights
without dropout.

Enters through :mod:`fullgraph.models.layers`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn")

from side_by_side import PygStack, losses_side_by_side  # noqa: E402

from fullgraph.datasets import Graph, load, to_pyg  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.distributed.halo import HaloPlan, SplitOperator  # noqa: E402
from fullgraph.models import GraphContext, layer_class  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.training import RunOptions, TrainConfig, Trainer  # noqa: E402
from fullgraph.training.assembly import build_operator  # noqa: E402


def _hub_graph(make_graph) -> Graph:
    """A random graph with isolated nodes and one hub linked to half of the nodes."""
    g = make_graph(num_nodes=300, num_isolated=7, num_features=10, seed=4, name="hub")
    n = g.num_nodes
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    src, dst = list(g.indices), list(rows)
    for v in range(1, n - 7, 2):  # node 0 is the hub (both directions)
        src += [0, v]
        dst += [v, 0]
    import scipy.sparse as sp

    a = sp.csr_matrix((np.ones(len(src), bool), (dst, src)), shape=(n, n))
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    g.indptr, g.indices = a.indptr.astype(np.int64), a.indices.astype(np.int64)
    return g.validate()


@pytest.fixture(params=["cora", "hub"])
def graph(request, make_graph, shared_dataset) -> Graph:
    if request.param == "cora":
        return load("cora", shared_dataset("cora"))
    return _hub_graph(make_graph)


def _context(graph: Graph, kind: str) -> GraphContext:
    """The one-process context of ``kind`` with the operator in float64 (rows in global order,
    as PyG's)."""
    part = whole_graph_part(graph, order="global")
    op = build_operator(part, kind)
    inner = op.inner.with_values(op.inner.values.double())
    return GraphContext(
        op=SplitOperator(inner, None),
        plan=HaloPlan.from_partition(part, Communicator()),
        global_ids=np.arange(graph.num_nodes, dtype=np.int64),
        seed=0,
    )


def _pyg_layer(kind: str, ours: torch.nn.Module) -> torch.nn.Module:
    """PyG's layer of ``kind`` holding our layer's weights (float64)."""
    d_in, d_out = ours.in_dim, ours.out_dim
    if kind == "gcn":
        ref = pyg_nn.GCNConv(d_in, d_out).double()
        ref.lin.weight.data.copy_(ours.lin.weight.data)
        ref.bias.data.copy_(ours.lin.bias.data)
    elif kind == "gin":
        mlp = torch.nn.Sequential(
            torch.nn.Linear(d_in, d_out), torch.nn.ReLU(), torch.nn.Linear(d_out, d_out)
        )
        ref = pyg_nn.GINConv(mlp, train_eps=True).double()
        ref.nn.load_state_dict(ours.mlp.state_dict())
        ref.eps.data.copy_(ours.eps.data)
    else:
        ref = pyg_nn.SAGEConv(d_in, d_out, aggr="mean").double()
        ref.lin_l.weight.data.copy_(ours.lin.weight.data)
        ref.lin_l.bias.data.copy_(ours.lin.bias.data)
        ref.lin_r.weight.data.copy_(ours.root.weight.data)
    return ref


def _pyg_grads(kind: str, ref: torch.nn.Module) -> list[torch.Tensor]:
    """PyG's parameter gradients in the order of our layer's parameters."""
    if kind == "gcn":
        return [ref.lin.weight.grad, ref.bias.grad]
    if kind == "gin":
        return [ref.eps.grad] + [p.grad for p in ref.nn.parameters()]
    return [ref.lin_l.weight.grad, ref.lin_l.bias.grad, ref.lin_r.weight.grad]


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("widths", [(16, 8), (8, 16)])  # transform first, aggregate first
def test_layer_equals_pyg(graph: Graph, kind: str, widths: tuple[int, int]) -> None:
    torch.manual_seed(0)
    d_in, d_out = widths
    x = torch.randn(graph.num_nodes, d_in, dtype=torch.float64)
    ours = layer_class(kind)(d_in, d_out).double()
    if kind == "gin":  # a non-zero eps, so that its gradient and the root term are checked
        ours.eps.data.fill_(0.3)
    ref = _pyg_layer(kind, ours)
    edge_index = to_pyg(graph).edge_index
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = ours(xa, _context(graph, kind))
    want = ref(xb, edge_index)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    ours_grads = [p.grad for p in ours.parameters()]
    for a, b in zip(ours_grads, _pyg_grads(kind, ref), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
def test_model_losses_equal_a_plain_pyg_model(graph: Graph, kind: str) -> None:
    """Five Adam epochs from the same weights, no dropout, weight decay on the first layer."""
    cfg = TrainConfig(model=kind, layers=2, hidden=16, dropout=0.0, lr=0.01, epochs=5, seed=1)
    tr = Trainer(whole_graph_part(graph), Communicator(), cfg, RunOptions(quiet=True))
    ref = PygStack(_pyg_layer(kind, layer) for layer in tr.model.layers).float()
    for a, b in zip(tr.model.layers, ref.convs, strict=True):  # float32 copies of the weights
        src = _pyg_layer(kind, a).float()
        b.load_state_dict(src.state_dict())
    ours, theirs = losses_side_by_side(tr, ref, graph)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
