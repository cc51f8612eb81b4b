"""Mini-batch GraphSAGE: same layer as the full-batch model, exact sampled blocks, P=2 == P=1."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloPlan
from fullgraph.errors import ConfigError, DataError
from fullgraph.minibatch.inference import RowOperator, layerwise_inference
from fullgraph.minibatch.model import block_forward
from fullgraph.minibatch.sampler import NeighborSampler, global_batches
from fullgraph.minibatch.trainer import MinibatchConfig, MinibatchTrainer
from fullgraph.models.gnn import GNN, GraphContext
from fullgraph.partition import whole_graph_part
from fullgraph.run.epochs import final_line
from fullgraph.training.assembly import build_operator


def sage(graph, layers: int = 2, hidden: int = 16, dropout: float = 0.0) -> GNN:
    torch.manual_seed(0)
    return GNN("sage", graph.num_features, hidden, graph.num_classes, layers, dropout, dropout)


def full_batch_logits(model: GNN, graph) -> torch.Tensor:
    """Logits of the full-batch trainer's code path on one process (rows in global order)."""
    part = whole_graph_part(graph, order="global")
    ctx = GraphContext(
        op=build_operator(part, "sage"),
        plan=HaloPlan.from_partition(part, Communicator()),
        global_ids=part.global_ids,
        seed=0,
    )
    with torch.no_grad():
        return model(torch.from_numpy(graph.x), ctx, training=False)


def test_layerwise_inference_matches_full_batch_model(small_graph) -> None:
    model = sage(small_graph, layers=3).eval()
    n = small_graph.num_nodes
    a = RowOperator.of(small_graph.indptr, small_graph.indices, 0, n)
    got = layerwise_inference(model, a, torch.from_numpy(small_graph.x), Communicator())
    torch.testing.assert_close(got, full_batch_logits(model, small_graph), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hidden", [32, 4])  # layer 2 aggregates first / transforms first
def test_inference_in_small_chunks_matches_full_batch_model(make_graph, hidden) -> None:
    graph = make_graph(num_nodes=300, num_features=12, seed=7)
    torch.manual_seed(0)
    model = GNN("sage", 12, hidden, graph.num_classes, 3, 0.0, 0.0).eval()
    a = RowOperator.of(graph.indptr, graph.indices, 0, graph.num_nodes)
    got = layerwise_inference(model, a, graph.x, Communicator(), chunk_rows=7)
    torch.testing.assert_close(got, full_batch_logits(model, graph), atol=1e-5, rtol=1e-5)


def test_row_operator_sorts_unsorted_rows_and_reads_sorted_ones_in_place(small_graph) -> None:
    n = small_graph.num_nodes
    lo, hi = 0, n
    sorted_op = RowOperator.of(small_graph.indptr, small_graph.indices, lo, hi)
    assert sorted_op.indices is small_graph.indices  # no copy
    shuffled = small_graph.indices.copy()
    rng = np.random.default_rng(0)
    for v in range(n):
        rng.shuffle(shuffled[small_graph.indptr[v] : small_graph.indptr[v + 1]])
    op = RowOperator.of(small_graph.indptr, shuffled, lo, hi)
    assert op.indices.size == int(small_graph.indptr[hi] - small_graph.indptr[lo])
    start = int(small_graph.indptr[lo])
    assert np.array_equal(op.indices, small_graph.indices[start : int(small_graph.indptr[hi])])
    model = sage(small_graph, layers=2).eval()
    x = small_graph.x
    torch.testing.assert_close(
        layerwise_inference(model, op, x, Communicator()),
        layerwise_inference(model, sorted_op, x, Communicator()),
        atol=0,
        rtol=0,
    )
    with pytest.raises(ValueError, match="rows"):  # not the rows this rank computes
        layerwise_inference(
            model, RowOperator.of(small_graph.indptr, small_graph.indices, 1, 9), x, Communicator()
        )


def test_blocks_with_all_neighbours_give_full_graph_logits(small_graph) -> None:
    # With fanout -1 every block holds all in-edges, so the seeds' logits are exact.
    model = sage(small_graph, layers=2).eval()
    sampler = NeighborSampler(small_graph.indptr, small_graph.indices, [-1, -1], seed=0)
    seeds = np.array([5, 77, 300, 599, 12], dtype=np.int64)  # 599 is isolated
    batch = sampler.sample(seeds)
    x_src = torch.from_numpy(small_graph.x[batch.nodes[: batch.blocks[0].num_src]])
    with torch.no_grad():
        got = block_forward(model, batch.blocks, x_src, batch.nodes)
    want = full_batch_logits(model, small_graph)[torch.from_numpy(seeds)]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sampled_training_learns_the_small_graph(small_graph) -> None:
    cfg = MinibatchConfig(fanouts=[5, 5], batch_size=32, hidden=32, lr=0.01, epochs=4)
    final = MinibatchTrainer(small_graph, Communicator(), cfg, quiet=True).fit()
    assert final["test_acc"] > 0.9, final
    assert final["ranks"] == 1 and final["best_epoch"] is not None


def test_binary_graph_reports_rocauc(make_graph) -> None:
    """``auto`` on two classes: the records, the best model and the final line by ROC-AUC."""
    graph = make_graph(num_classes=2, p_in=0.55, num_features=4, seed=1, name="bin")
    cfg = MinibatchConfig(fanouts=[5, 5], batch_size=64, hidden=16, lr=0.01, epochs=3)
    log = io.StringIO()
    final = MinibatchTrainer(graph, Communicator(), cfg, quiet=True).fit(log)
    rows = [json.loads(line) for line in log.getvalue().splitlines()]
    assert all({"train_rocauc", "val_rocauc", "test_rocauc"} <= set(r) for r in rows[:-1])
    assert not any("val_acc" in r or "best_val_acc" in r for r in rows)
    assert rows[-1] == final and final["metric"] == "rocauc"
    assert final["best_val_rocauc"] == max(r["val_rocauc"] for r in rows[:-1]) > 0.5
    assert "best val rocauc" in final_line(final, 1)
    acc = MinibatchConfig(fanouts=[5, 5], batch_size=64, hidden=16, epochs=1, metric="acc")
    assert "best_val_acc" in MinibatchTrainer(graph, Communicator(), acc, quiet=True).fit()
    with pytest.raises(ConfigError, match="needs a binary task, but sbm-test has 4 classes"):
        MinibatchTrainer(make_graph(), Communicator(), MinibatchConfig(metric="rocauc"))


def test_dropout_masks_follow_global_ids(small_graph) -> None:
    # Same batch sampled twice: same loss; a different batch index: a different dropout stream.
    cfg = MinibatchConfig(fanouts=[4, 4], batch_size=64, hidden=16, dropout=0.5, epochs=1)
    tr = MinibatchTrainer(small_graph, Communicator(), cfg)
    batch = global_batches(tr.train_nodes, 64, 0, 1)[0]
    loss_a, stats = tr.gradient(1, 0, batch)
    grad_a = torch.cat([p.grad.reshape(-1).clone() for p in tr.model.parameters()])
    loss_b, _ = tr.gradient(1, 0, batch)
    grad_b = torch.cat([p.grad.reshape(-1).clone() for p in tr.model.parameters()])
    assert loss_a == loss_b and torch.equal(grad_a, grad_b)
    assert stats.sampled_edges > 0 and stats.seconds >= stats.sample_s > 0
    loss_c, _ = tr.gradient(1, 1, batch)
    assert loss_c != loss_a


def test_bad_configs_are_rejected(small_graph, make_graph) -> None:
    with pytest.raises(ConfigError, match="dropout"):
        MinibatchTrainer(small_graph, Communicator(), MinibatchConfig(dropout=1.0))
    with pytest.raises(DataError, match="no node features"):
        MinibatchTrainer(make_graph(num_features=0), Communicator(), MinibatchConfig())
    with pytest.raises(DataError, match="no training nodes"):
        MinibatchTrainer(make_graph(train_fraction=0.0), Communicator(), MinibatchConfig())
    with pytest.raises(ValueError, match="blocks for a"):
        sampler = NeighborSampler(small_graph.indptr, small_graph.indices, [3])
        batch = sampler.sample(np.array([1]))
        block_forward(sage(small_graph, layers=2), batch.blocks, torch.zeros(1), batch.nodes)
