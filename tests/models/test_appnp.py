"""``--model appnp`` against PyG, on one process, and its options.

- our APPNP (a 2-layer MLP of per-row linears, then ``K`` steps of personalised PageRank on
  ``D^-1/2 (A + I) D^-1/2``) equals PyG's ``MLP`` with the same weights followed by
  ``APPNP(K, alpha)``: the logits, the input's gradient and every weight's gradient of a
  random linear loss to 1e-6 in float64, for K = 1, 3, 10 and alpha = 0.1, 0.5, 1, on a graph
  with isolated nodes and a hub, and on a directed one (the propagation trains end to end);
- no tensor of the propagation is kept for the backward pass (it is linear: the autograd
  graph holds no activation of class width);
- bad input, one line: ``--hops`` / ``--alpha`` on a kind that does not take them,
  ``--propagation`` on appnp, alpha outside (0, 1], K of 0 or beyond the limit.

The bit-identical runs at P ranks are ``tests/training/test_bitwise*.py``'s (``appnp;hops=3``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from cli_run import assert_one_line, run_cli

pyg_nn = pytest.importorskip("torch_geometric.nn")

from fullgraph.datasets import Graph, to_pyg  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.distributed.halo import HaloPlan, SplitOperator  # noqa: E402
from fullgraph.errors import ConfigError  # noqa: E402
from fullgraph.models import GraphContext  # noqa: E402
from fullgraph.models.gnn import GNN  # noqa: E402
from fullgraph.models.layers import LayerOptions  # noqa: E402
from fullgraph.models.layers.appnp import APPNPLayer, propagation_steps  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.training import TrainConfig  # noqa: E402
from fullgraph.training.assembly import build_operator  # noqa: E402


def _hub_graph(make_graph, directed: bool) -> Graph:
    """150 nodes, 5 isolated, node 0 linked to every second linked node (both ways)."""
    g = make_graph(num_nodes=150, num_isolated=5, num_features=10, seed=2, directed=directed)
    n = g.num_nodes
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    src, dst = list(g.indices), list(rows)
    for v in range(1, n - 5, 2):
        src += [0, v]
        dst += [v, 0]
    a = sp.csr_matrix((np.ones(len(src), bool), (dst, src)), shape=(n, n))
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    g.indptr, g.indices = a.indptr.astype(np.int64), a.indices.astype(np.int64)
    return g.validate()


@pytest.fixture(scope="module", params=["symmetric", "directed"])
def graph(request, make_graph) -> Graph:
    return _hub_graph(make_graph, directed=request.param == "directed")


def _context(graph: Graph) -> GraphContext:
    """The one-process context of appnp, its operator in float64, rows in global order."""
    part = whole_graph_part(graph, order="global")
    op = build_operator(part, "appnp")
    inner = op.inner.with_values(op.inner.values.double())
    return GraphContext(
        op=SplitOperator(inner, None),
        plan=HaloPlan.from_partition(part, Communicator()),
        global_ids=np.arange(graph.num_nodes, dtype=np.int64),
        seed=0,
    )


def _models(graph: Graph, hops: int, alpha: float) -> tuple[GNN, torch.nn.Module]:
    """Our appnp (float64, random weights) and PyG's MLP holding the same weights."""
    torch.manual_seed(hops)
    opts = LayerOptions(hops=hops, alpha=alpha)
    ours = GNN("appnp", graph.num_features, 16, graph.num_classes, 2, 0.0, 0.0, options=opts)
    ours = ours.double()
    mlp = pyg_nn.MLP([graph.num_features, 16, graph.num_classes], dropout=0.0, norm=None)
    mlp = mlp.double()
    for lin, layer in zip(mlp.lins, ours.layers, strict=True):
        lin.weight.data.copy_(layer.lin.weight.data)
        lin.bias.data.copy_(layer.lin.bias.data)
    return ours, mlp


@pytest.mark.parametrize(("hops", "alpha"), [(1, 0.1), (3, 0.5), (10, 0.1), (10, 1.0)])
def test_appnp_equals_pyg_mlp_then_appnp(graph: Graph, hops: int, alpha: float) -> None:
    ours, mlp = _models(graph, hops, alpha)
    assert ours.layers[-1].hops == hops and ours.layers[0].hops == 0
    edge_index = to_pyg(graph).edge_index
    x = torch.from_numpy(graph.x).double()
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = ours(xa, _context(graph), training=True)
    want = pyg_nn.APPNP(hops, alpha)(mlp(xb), edge_index)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    for layer, lin in zip(ours.layers, mlp.lins, strict=True):
        torch.testing.assert_close(layer.lin.weight.grad, lin.weight.grad, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(layer.lin.bias.grad, lin.bias.grad, rtol=1e-6, atol=1e-6)
    if alpha < 1:  # the propagation matters: without it the logits differ
        assert not torch.allclose(out, mlp(x), atol=1e-3)


def test_the_propagation_keeps_no_activation(graph: Graph) -> None:
    """The autograd graph of the propagation saves no tensor of ``[n, C]``: only the MLP's
    inputs (its linears') are kept, whatever K."""
    ctx = _context(graph)
    n = graph.num_nodes
    kept: dict[int, list[tuple[int, ...]]] = {}
    for hops in (1, 10):
        ours, _ = _models(graph, hops, 0.1)
        x = torch.from_numpy(graph.x).double()
        shapes: list[tuple[int, ...]] = []

        def pack(t: torch.Tensor, shapes: list = shapes) -> torch.Tensor:
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            ours(x, ctx, training=True)
        kept[hops] = sorted(s for s in shapes if s and s[0] == n)
    assert kept[1] == kept[10]
    assert (n, graph.num_classes) not in kept[10]


def test_default_steps_are_the_papers() -> None:
    assert propagation_steps(LayerOptions()) == (10, 0.1)
    layer = APPNPLayer.build(8, 3, last=True, options=LayerOptions(hops=4, alpha=0.25))
    assert (layer.hops, layer.alpha) == (4, 0.25)
    assert APPNPLayer.build(8, 3, last=False, options=LayerOptions()).hops == 0


@pytest.mark.parametrize(
    ("fields", "needles"),
    [
        ({"model": "gcn", "hops": 3}, ["--hops applies to --model", "appnp", "not --model gcn"]),
        ({"model": "mlp", "alpha": 0.2}, ["--alpha applies to --model", "not --model mlp"]),
        ({"model": "appnp", "alpha": 0.0}, ["--alpha must be in (0, 1], not 0"]),
        ({"model": "appnp", "alpha": 1.5}, ["--alpha must be in (0, 1], not 1.5"]),
        ({"model": "appnp", "hops": 0}, ["--hops"]),
        ({"model": "appnp", "hops": 101}, ["--hops 101 is beyond the 100"]),
        ({"model": "appnp", "propagation": "gcn"}, ["--propagation applies to"]),
    ],
)
def test_options_it_does_not_take_or_refuses(fields: dict, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(**fields)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_command_line_refuses_hops_on_gcn_in_one_line(capsys) -> None:
    argv = ["train", "--synthetic", "tiny", "--model", "gcn", "--hops", "3", "--quiet"]
    code, out, err = run_cli(argv, capsys)
    assert_one_line(code, err, "--hops applies to --model", "not --model gcn")
    code, out, err = run_cli([*argv[:4], "appnp", "--alpha", "2", "--quiet"], capsys)
    assert_one_line(code, err, "--alpha must be in (0, 1]")
