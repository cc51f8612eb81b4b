"""``--model mlp``: per-row linears, against PyG's ``MLP``, and nothing exchanged.

- a 3-layer stack equals PyG's ``MLP([F, H, H, C], norm=None)`` with the same weights: logits,
  input gradient and weight gradients to 1e-6 in float64;
- training and evaluation never aggregate (the aggregation is made to fail: it is not
  called), the operator has no entry and no edge structure is kept; the loss falls;
- ``--layers 1`` is the linear model of "Linear + C&S".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn")

from fullgraph.distributed import Communicator, halo  # noqa: E402
from fullgraph.models.gnn import GNN  # noqa: E402
from fullgraph.partition import whole_graph_part  # noqa: E402
from fullgraph.training import RunOptions, TrainConfig, Trainer  # noqa: E402
from fullgraph.training.assembly import rank_context  # noqa: E402


@pytest.mark.parametrize("layers", [1, 3])
def test_mlp_equals_pyg_mlp(small_graph, layers: int) -> None:
    torch.manual_seed(layers)
    f, c = small_graph.num_features, small_graph.num_classes
    ours = GNN("mlp", f, 16, c, layers, 0.0, 0.0).double()
    theirs = pyg_nn.MLP([f, *([16] * (layers - 1)), c], dropout=0.0, norm=None).double()
    for lin, layer in zip(theirs.lins, ours.layers, strict=True):
        lin.weight.data.copy_(layer.lin.weight.data)
        lin.bias.data.copy_(layer.lin.bias.data)
    part = whole_graph_part(small_graph)
    plan = halo.HaloPlan.from_partition(part, Communicator())
    ctx = rank_context(part, plan, "mlp", seed=0)
    x = torch.from_numpy(np.asarray(part.x)).double()
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, want = ours(xa, ctx, training=True), theirs(xb)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    for layer, lin in zip(ours.layers, theirs.lins, strict=True):
        torch.testing.assert_close(layer.lin.weight.grad, lin.weight.grad, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(layer.lin.bias.grad, lin.bias.grad, rtol=1e-6, atol=1e-6)


def _no_aggregation(*args, **kwargs):
    raise AssertionError("an mlp aggregated")


def test_mlp_trains_without_aggregating(small_graph, monkeypatch) -> None:
    cfg = TrainConfig(model="mlp", layers=2, hidden=16, dropout=0.5, lr=0.05, epochs=20, seed=1)
    tr = Trainer(whole_graph_part(small_graph), Communicator(), cfg, RunOptions(quiet=True))
    assert tr.ctx.op.inner.nnz == 0 and tr.ctx.op.halo is None
    assert tr.ctx.structure is None and tr.ctx.first_aggregate is None
    assert tr.ctx.train_graphs is None
    for name in ("aggregate_rows", "aggregate_transpose"):
        monkeypatch.setattr(halo, name, _no_aggregation)
    losses = [tr.train_step(epoch).loss for epoch in range(1, cfg.epochs + 1)]
    assert losses[-1] < 0.8 * losses[0], losses
    tr.evaluate()
