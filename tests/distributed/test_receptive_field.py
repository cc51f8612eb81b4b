"""Receptive-field pruning (:mod:`fullgraph.distributed.receptive_field`): the rows each layer
keeps are those the loss reaches, and training with them gives the unpruned numbers.

The distributed side (restricted halo plans at P = 2, 4 over mpi and gloo equal one unpruned
process) is checked in ``test_train_exact.py`` (variant ``sage`` against ``sage_unpruned``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.receptive_field import prune_layers
from fullgraph.models.gnn import parameter_vector
from fullgraph.partition import whole_graph_part
from fullgraph.training import RunOptions, TrainConfig, Trainer
from fullgraph.training.assembly import assemble_rank


@pytest.fixture(scope="module")
def sparse_train_graph(make_graph):
    """Few training nodes (5%) and low degree: every layer but the first is pruned."""
    return make_graph(num_nodes=800, avg_degree=3.0, train_fraction=0.05, seed=4)


def _reach(graph, layers: int) -> list[np.ndarray]:
    """Per layer (first to last), the output rows the loss reaches, by breadth-first search."""
    n = graph.num_nodes
    adj = sp.csr_matrix(
        (np.ones(len(graph.indices)), np.asarray(graph.indices), np.asarray(graph.indptr)),
        shape=(n, n),
    )
    rows = np.asarray(graph.train_mask, dtype=bool)
    out = [rows]
    for _ in range(layers - 1):
        below = rows.copy()
        below[adj[np.flatnonzero(rows)].indices] = True
        rows = below
        out.append(rows)
    return out[::-1]


def _trainer(graph, **fields) -> Trainer:
    cfg = TrainConfig(
        **{"layers": 3, "hidden": 16, "dropout": 0.5, "epochs": 6, "seed": 2, **fields}
    )
    return Trainer(whole_graph_part(graph), Communicator(), cfg, RunOptions(quiet=True))


def test_kept_rows_are_the_receptive_field(sparse_train_graph) -> None:
    """Rows kept per layer == breadth-first search from the training nodes (GCN: every row
    has its self-loop, so a kept row is exactly a non-empty one)."""
    g = sparse_train_graph
    part = whole_graph_part(g)  # rows in block order: row i is node part.global_ids[i]
    rank = assemble_rank(part, Communicator(), TrainConfig(model="gcn", layers=3))
    graphs = prune_layers(rank.ctx.op, rank.ctx.plan, rank.data["train"], 3, min_saving=0.0)
    for i, (graph, want) in enumerate(zip(graphs, _reach(g, 3), strict=True)):
        got = np.empty(g.num_nodes, dtype=bool)
        got[part.global_ids] = (graph.op.inner.row_nnz() > 0).numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"layer {i}")
        assert graph.rows == int(want.sum()) and graph.pruned
    assert graphs[-1].rows == int(np.asarray(g.train_mask).sum())
    assert graphs[0].rows < g.num_nodes  # the test graph prunes every layer


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "gcn"},
        {"model": "sage"},
        {"model": "sage", "input_dropout": 0.0},  # precomputed first aggregation
        {"model": "sage", "norm": "layer", "residual": True},
        {"model": "gcn", "layers": 1},
    ],
    ids=["gcn", "sage", "sage-precomputed", "sage-layernorm-residual", "gcn-1-layer"],
)
def test_pruned_training_equals_unpruned(sparse_train_graph, fields) -> None:
    """Gradients, losses and parameters after 6 steps are the same numbers, bit for bit."""
    runs = {}
    for prune in ("auto", "off"):
        tr = _trainer(sparse_train_graph, prune=prune, **fields)
        assert (tr.ctx.train_graphs is not None) == (prune == "auto")
        steps = [tr.train_step(epoch) for epoch in range(1, 7)]
        grads = torch.cat([p.grad.reshape(-1) for p in tr.model.parameters()])
        runs[prune] = ([s.loss for s in steps], grads, parameter_vector(tr.model))
        if prune == "auto":
            assert any(g.pruned for g in tr.ctx.train_graphs)
    (loss_a, grad_a, par_a), (loss_b, grad_b, par_b) = runs["auto"], runs["off"]
    assert loss_a == loss_b
    assert torch.equal(grad_a, grad_b)
    assert torch.equal(par_a, par_b)
    assert loss_a[-1] < loss_a[0]  # it trained


def test_evaluation_uses_the_whole_graph(sparse_train_graph) -> None:
    """Accuracy over validation and test nodes (outside the pruned rows) is the unpruned one."""
    accs = []
    for prune in ("auto", "off"):
        tr = _trainer(sparse_train_graph, model="sage", prune=prune)
        for epoch in range(1, 4):
            tr.train_step(epoch)
        accs.append(tr.evaluate())
    assert accs[0] == accs[1]


@pytest.mark.parametrize(
    "fields",
    [{"model": "gat"}, {"model": "gcn", "norm": "batch"}, {"model": "sage", "prune": "off"}],
    ids=["gat", "batchnorm", "off"],
)
def test_not_pruned(sparse_train_graph, fields) -> None:
    """Attention weighs edges itself and BatchNorm mixes all rows: those train whole."""
    assert _trainer(sparse_train_graph, **fields).ctx.train_graphs is None


def test_layer_left_whole_when_pruning_saves_little(small_graph) -> None:
    """With 30% training nodes and mean degree 8, the first layer keeps almost every edge and
    is left whole (the very operator and plan, no copy); the last one is pruned."""
    tr = _trainer(small_graph, model="gcn")
    first, last = tr.ctx.train_graphs[0], tr.ctx.train_graphs[-1]
    assert not first.pruned and first.op is tr.ctx.op and first.plan is tr.ctx.plan
    assert last.pruned and last.rows == int(np.asarray(small_graph.train_mask).sum())
    assert "pruned" in last.describe(2) and "whole" in first.describe(0)
    assert tr.ctx.plans() == [tr.ctx.plan]  # one process: nothing to exchange, one plan
