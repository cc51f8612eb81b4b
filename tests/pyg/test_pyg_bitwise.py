"""Bit-identical at any rank count through ``fullgraph.pyg`` (issue 33): PyG's own ``GCN``,
``GraphSAGE`` (with ``norm="layer_norm"``, node mode) and ``GIN(train_eps=True)`` classes (2
layers, dropout 0.5), converted with ``pyg.distribute`` and trained 4 steps by a user's script
(their own ``Adam`` and ``F.cross_entropy(out[mask], y[mask])``) on P = 2 ranks over mpi and
gloo equal one process on the whole graph ``torch.equal``: the first step's gradients, every
step's loss, the final parameters and Adam's moments.

What makes it hold: the partition's fixed node blocks (``fullgraph partition``'s, and the
whole graph's on one process), the step's block tree in force during the training forward
(:mod:`fullgraph.pyg.runtime`), so that every ``F.linear`` over the inner rows and every
twin's bias push per-block partials (:mod:`fullgraph.pyg.functional`,
:mod:`fullgraph.pyg.twins`; ``GINConv``'s ``eps`` its own per-block sums, ``F.layer_norm``'s
weight and bias :class:`~fullgraph.models.norm.NodeLayerNorm`'s), the aggregations
summed in ascending global id, and the loss's value an exact sum
(:func:`fullgraph.pyg.node_reductions.exact_sum`). The negative control, the same run with
the tree off (every gradient all-reduced in rank order, as a partition without blocks
trains), differs from one process in its gradients and parameters (measured: by up to 7e-8),
so the test can fail.

Enters through :mod:`fullgraph.pyg.runtime`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from harness import run_task
from mp_utils import one_thread

pytest.importorskip("torch_geometric.nn")

import pyg_bitwise_worker

from fullgraph import pyg
from fullgraph.datasets import Graph
from fullgraph.distributed import Communicator
from fullgraph.pyg import runtime

FIELDS = ("grads", "losses", "params", "adam")


@pytest.fixture(scope="module")
def reference(small_graph: Graph) -> dict[str, np.ndarray]:
    """The models trained on one process (the whole graph, its blocks cut in process), one
    thread as the workers."""
    with one_thread(), torch.random.fork_rng():
        return pyg_bitwise_worker.run_models(pyg.load_part(small_graph, Communicator()))


@pytest.fixture(scope="module")
def two_ranks(small_partitions: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The models on the 2-part METIS partition over mpi and gloo, and the control over mpi."""
    out = tmp_path_factory.mktemp("pyg-bitwise") / "p2.npz"
    return run_task(
        pyg_bitwise_worker.bitwise,
        ranks=2,
        out=out,
        timeout=280,
        source=small_partitions[2],
        transports=["mpi", "gloo"],
        control=1,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["mpi", "gloo"])
def test_two_ranks_equal_one_process_bit_for_bit(
    transport: str, two_ranks: dict, reference: dict
) -> None:
    """Gradients, losses, parameters and Adam's state of P = 2 ``torch.equal`` one process."""
    for name in pyg_bitwise_worker.MODELS:
        for field in FIELDS:
            key = f"{name}/{field}"
            got = torch.from_numpy(two_ranks[f"{transport}/{key}"])
            want = torch.from_numpy(reference[key])
            assert got.shape == want.shape, (transport, key)
            assert torch.equal(got, want), (transport, key, float((got - want).abs().max()))


@pytest.mark.timeout(300)
def test_rank_order_control_differs(two_ranks: dict, reference: dict) -> None:
    """Without the tree (gradients all-reduced in rank order) P = 2 is not one process's
    bits: the comparison above can fail."""
    for name in pyg_bitwise_worker.MODELS:
        for field in ("grads", "params"):
            key = f"{name}/{field}"
            got, want = two_ranks[f"control/{key}"], reference[key]
            assert np.allclose(got, want, rtol=1e-5, atol=1e-6), key  # still the same model
            assert not np.array_equal(got, want), key


def test_the_tree_is_in_force_for_a_training_pass(small_graph: Graph) -> None:
    """One process: a training forward with a gradient runs under the part's block tree, its
    parameters take the tree (none gets a ``.grad`` from autograd before the reduction), and
    an evaluation pass runs without it."""
    from fullgraph.distributed import tree_sum

    data = pyg.load_part(small_graph, Communicator())
    torch.manual_seed(0)
    model = pyg.distribute(pyg_bitwise_worker.MODELS["GraphSAGE-ln"](data.num_features, 4), data)
    run: runtime.ModelRun = model._fullgraph_run
    assert run.layout is not None and run.layout.num_rows == data.num_nodes
    seen: list[object] = []
    hook = lambda *args: seen.append(tree_sum.active_gradients())  # noqa: E731
    model.convs[0].register_forward_hook(hook)  # inside the model's forward
    model.train()
    out = model(data.x, data.edge_index)
    tree = seen[-1]
    assert isinstance(tree, tree_sum.BlockGradients)
    torch.nn.functional.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
    assert all(tree.holds(p) for p in model.parameters())
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        model(data.x, data.edge_index)
    assert seen[-1] is None


def test_exact_sum_is_the_sum_rounded_once() -> None:
    """:func:`exact_sum` of float32 rows is ``math.fsum`` (the exact sum rounded once) per
    column, for values of very different scales and signs, no rows included; torch's float32
    sum is not (it rounds as it goes); a non-finite value gives ``None``."""
    import math

    from fullgraph.pyg.node_reductions import exact_sum

    part = pyg.load_part(build_small(), Communicator()).fullgraph
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(5000, 3, generator=g) * torch.logspace(-20, 20, 5000).unsqueeze(1)
    rows[::7] *= -1
    got = exact_sum(part, rows)
    want = [math.fsum(rows[:, c].double().tolist()) for c in range(3)]
    assert got.dtype == torch.float64 and got.tolist() == want
    assert rows.sum(0).double().tolist() != want
    assert exact_sum(part, rows[:0]).tolist() == [0.0, 0.0, 0.0]
    rows[3, 1] = math.inf
    assert exact_sum(part, rows) is None


def build_small() -> Graph:
    """A small graph for the one-process checks."""
    from conftest import build_sbm_graph

    return build_sbm_graph(num_nodes=60)
