"""The GAT layer against PyG's ``GATConv``, and its attention-dropout masks.

- Forward and gradients (input and every parameter) equal ``GATConv`` with the same weights to
  1e-6 in float64, for a hidden layer (heads concatenated) and a last layer (heads averaged), on
  Cora and on a random graph with isolated nodes and a hub, on both kernel back-ends.
- Five Adam epochs of a two-layer GAT (no dropout) give the losses of a plain PyG model trained
  from the same weights.
- With attention dropout on, the mask is a pure function of (seed, epoch, layer, head, edge):
  the output is the same on a renumbered view of the graph and, row for row, on the parts of a
  partition; it changes with the epoch and the layer.
- Head counts and the attention dropout are checked with one-line errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pyg_nn = pytest.importorskip("torch_geometric.nn")

from test_pyg_parity import _hub_graph  # noqa: E402

from fullgraph.datasets import Graph, load, to_pyg  # noqa: E402
from fullgraph.distributed import Communicator  # noqa: E402
from fullgraph.distributed.halo import HaloPlan, SplitOperator  # noqa: E402
from fullgraph.errors import ConfigError  # noqa: E402
from fullgraph.kernels import CSRMatrix  # noqa: E402
from fullgraph.kernels.attention_dropout import attention_keys  # noqa: E402
from fullgraph.kernels.attention_graph import AttentionGraph  # noqa: E402
from fullgraph.kernels.edge_attention import edge_attention  # noqa: E402
from fullgraph.models import GNN, GraphContext, layer_class  # noqa: E402
from fullgraph.models.layers import LayerOptions  # noqa: E402
from fullgraph.models.local_graph import no_operator  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.training import RunOptions, TrainConfig, Trainer  # noqa: E402


@pytest.fixture(params=["cora", "hub"])
def graph(request, make_graph, shared_dataset) -> Graph:
    if request.param == "cora":
        return load("cora", shared_dataset("cora"))
    return _hub_graph(make_graph)


def _context(
    indptr: np.ndarray, indices: np.ndarray, gids: np.ndarray, seed: int = 0
) -> GraphContext:
    """A one-process context over the in-edge CSR ``indptr, indices`` with global ids ``gids``."""
    n = len(indptr) - 1
    structure = CSRMatrix(torch.from_numpy(indptr), torch.from_numpy(indices), None, n)
    plan = HaloPlan(Communicator(), torch.zeros(0, dtype=torch.int64), [0], [0], n, 0)
    return GraphContext(
        op=SplitOperator(no_operator(structure, n), None),  # attention reads the structure
        plan=plan,
        global_ids=np.asarray(gids, dtype=np.int64),
        seed=seed,
        structure=structure,
        local_global_ids=np.asarray(gids, dtype=np.int64),
    )


def _graph_context(graph: Graph, seed: int = 0) -> GraphContext:
    return _context(graph.indptr, graph.indices, np.arange(graph.num_nodes), seed)


def _pyg_gat(ours: torch.nn.Module) -> torch.nn.Module:
    """PyG's ``GATConv`` holding our layer's weights (float64)."""
    ref = pyg_nn.GATConv(ours.in_dim, ours.width, heads=ours.heads, concat=ours.concat).double()
    ref.lin.weight.data.copy_(ours.lin.weight.data)
    ref.att_src.data.copy_(ours.att_src.data)
    ref.att_dst.data.copy_(ours.att_dst.data)
    ref.bias.data.copy_(ours.bias.data)
    return ref


@pytest.mark.parametrize("kernel", ["cpu", "torch"])
@pytest.mark.parametrize(
    ("last", "in_dim", "width", "heads"),
    [(False, 16, 8, 3), (True, 24, 5, 2), (False, 40, 4, 1)],
)
def test_layer_equals_pyg(
    graph: Graph, kernel: str, last: bool, in_dim: int, width: int, heads: int, monkeypatch
) -> None:
    monkeypatch.setenv("FULLGRAPH_KERNEL", kernel)
    torch.manual_seed(0)
    options = LayerOptions(heads=heads, output_heads=heads)
    ours = layer_class("gat").build(in_dim, width, last=last, options=options).double()
    assert ours.out_dim == (width if last else width * heads)
    with torch.no_grad():
        ours.bias.normal_()  # not zero, so that its gradient and placement are checked
    ref = _pyg_gat(ours)
    x = torch.randn(graph.num_nodes, in_dim, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = ours(xa, _graph_context(graph))
    want = ref(xb, to_pyg(graph).edge_index)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    for name in ("lin.weight", "att_src", "att_dst", "bias"):
        a = ours.get_parameter(name).grad
        b = ref.get_parameter(name).grad
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


def test_model_losses_equal_a_plain_pyg_model(graph: Graph) -> None:
    """Five Adam epochs from the same weights, no dropout, weight decay on every layer."""
    cfg = TrainConfig(
        model="gat",
        layers=2,
        hidden=8,
        heads=4,
        output_heads=2,
        dropout=0.0,
        lr=0.005,
        weight_decay_scope="all",
        epochs=5,
        seed=1,
    )
    tr = Trainer(whole_graph_part(graph), Communicator(), cfg, RunOptions(quiet=True))
    convs = torch.nn.ModuleList(_pyg_gat(layer).float() for layer in tr.model.layers)
    opt = torch.optim.Adam(convs.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    data = to_pyg(graph)
    train = torch.from_numpy(graph.train_mask)
    y = torch.from_numpy(graph.y)
    ours, theirs = [], []
    for epoch in range(1, 6):
        ours.append(tr.train_step(epoch).loss)
        opt.zero_grad()
        h = data.x
        for i, conv in enumerate(convs):
            h = conv(h, data.edge_index)
            h = F.relu(h) if i < len(convs) - 1 else h
        loss = F.cross_entropy(h[train], y[train])
        loss.backward()
        opt.step()
        theirs.append(float(loss.detach()))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def _dropped_layer(in_dim: int = 6, heads: int = 5) -> torch.nn.Module:
    torch.manual_seed(3)
    options = LayerOptions(heads=heads, attention_dropout=0.5)
    return layer_class("gat").build(in_dim, 3, last=False, options=options).double()


def test_attention_dropout_is_the_same_on_a_renumbered_graph(make_graph) -> None:
    graph = _hub_graph(make_graph)
    n = graph.num_nodes
    layer = _dropped_layer()
    x = torch.randn(n, 6, dtype=torch.float64)
    want = layer(x, _graph_context(graph, seed=7), epoch=4, training=True, index=1)
    perm = np.random.default_rng(0).permutation(n)  # local id k holds node perm[k]
    import scipy.sparse as sp

    a = sp.csr_matrix((np.ones(graph.num_edges), graph.indices, graph.indptr), shape=(n, n))
    b = a[perm][:, perm].tocsr()
    b.sort_indices()
    ctx = _context(b.indptr.astype(np.int64), b.indices.astype(np.int64), perm, seed=7)
    got = layer(x[perm], ctx, epoch=4, training=True, index=1)
    torch.testing.assert_close(got, want[perm], rtol=1e-12, atol=1e-12)
    # the masks do change with the epoch and the layer, and evaluation drops nothing
    ctx0 = _graph_context(graph, seed=7)
    assert not torch.allclose(want, layer(x, ctx0, epoch=5, training=True, index=1))
    assert not torch.allclose(want, layer(x, ctx0, epoch=4, training=True, index=2))
    layer.attention_dropout = 0.0
    no_drop = layer(x, ctx0, epoch=4, training=True, index=1)
    torch.testing.assert_close(layer(x, ctx0, epoch=4, training=False, index=1), no_drop)


def test_attention_dropout_is_the_same_on_every_part(make_graph, tmp_path) -> None:
    """Each part's rows (its in-edges, halo columns, local numbering) equal the whole graph's."""
    from fullgraph.partition import load_partition, partition_graph

    graph = _hub_graph(make_graph)
    heads, width = 6, 3
    torch.manual_seed(0)
    rows = torch.randn(graph.num_nodes, heads * (width + 2), dtype=torch.float64)
    keys = attention_keys(11, 2, 1, heads)
    whole = AttentionGraph.of(_graph_context(graph).structure, np.arange(graph.num_nodes))
    args = {"heads": heads, "width": width, "p": 0.5, "keys": keys}
    want = edge_attention(rows, None, whole, **args)
    partition_graph(graph, 3, tmp_path / "parts", method="metis", seed=0)
    for rank in range(3):
        part = load_partition(tmp_path / "parts", rank)
        gids = np.array(part.global_ids, dtype=np.int64)
        n_local = int(part.num_inner) + int(part.num_halo)
        structure = CSRMatrix(
            torch.from_numpy(np.array(part.indptr, dtype=np.int64)),
            torch.from_numpy(np.array(part.indices, dtype=np.int64)),
            None,
            n_local,
        )
        got = edge_attention(rows[gids], None, AttentionGraph.of(structure, gids), **args)
        inner = gids[: part.num_inner]
        torch.testing.assert_close(got, want[inner], rtol=1e-12, atol=1e-12)


def test_stack_widths() -> None:
    model = GNN("gat", 10, 8, 7, 3, 0.5, 0.5, options=LayerOptions(heads=4, output_heads=2))
    assert model.dims == [10, 32, 32, 7]
    assert [lay.heads for lay in model.layers] == [4, 4, 2]
    assert [lay.concat for lay in model.layers] == [True, True, False]


def test_exchange_choice_is_the_narrower() -> None:
    gat = layer_class("gat")
    # input 12 < 3 * (8 + 1) = 27 columns of projected rows and source terms: send the input
    assert gat(12, 8, 3).exchanges_input
    # 1433 bag-of-words columns against 8 * (8 + 1) = 72: send the projected rows
    assert not gat(1433, 8, 8).exchanges_input
    assert not gat(27, 8, 3).exchanges_input  # a tie: no halo projection to redo


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (LayerOptions(heads=0), "--heads"),
        (LayerOptions(output_heads=0), "--output-heads"),
        (LayerOptions(heads=2.5), "--heads"),
        (LayerOptions(attention_dropout=1.0), "--attention-dropout"),
        (LayerOptions(attention_dropout=-0.1), "--attention-dropout"),
    ],
)
def test_bad_options_are_refused(options: LayerOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        GNN("gat", 10, 8, 7, 2, 0.5, 0.5, options=options)
    assert "\n" not in str(info.value)


def test_config_checks_head_options() -> None:
    with pytest.raises(ConfigError, match="--heads"):
        TrainConfig(model="gat", heads=0)
    with pytest.raises(ConfigError, match="--output-heads"):
        TrainConfig(model="gat", output_heads=0)
    with pytest.raises(ConfigError, match="applies to --model gat only"):
        TrainConfig(model="gcn", heads=2)
    opts = TrainConfig(model="gat", heads=8, dropout=0.6).layer_options()
    assert (opts.heads, opts.output_heads, opts.attention_dropout) == (8, 1, 0.6)
