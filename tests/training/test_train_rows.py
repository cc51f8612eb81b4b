"""Training steps on the training rows alone for per-row stacks (MLP, SGC, SIGN): when it is in
force, that it computes only those rows, that it trains to the same numbers as every row (to
float rounding), and the restricted block layout. Bit-identity at P ranks is
tests/training/test_bitwise_hops.py and test_bitwise.py (their models train with it)."""

from __future__ import annotations

from pathlib import Path

import bitwise_worker
import numpy as np
import pytest
import torch
from bitwise_worker import train_models
from conftest import build_sbm_graph
from harness import run_task
from mp_utils import one_thread

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.tree_sum import BlockLayout, row_sum
from fullgraph.models.gnn import parameter_vector
from fullgraph.partition import partition_graph, whole_graph_part
from fullgraph.training import RunOptions, TrainConfig, Trainer


def _trainer(part, **settings) -> Trainer:
    base = dict(layers=2, hidden=16, dropout=0.5, epochs=3, seed=3, lr=0.05)
    return Trainer(
        part, Communicator(), TrainConfig(**{**base, **settings}), RunOptions(quiet=True)
    )


@pytest.fixture(scope="module")
def part(small_graph):
    return whole_graph_part(small_graph)


@pytest.mark.parametrize(
    ("settings", "restricted"),
    [
        ({"model": "mlp"}, True),
        ({"model": "sgc"}, True),
        ({"model": "sign", "hops": 2}, True),
        ({"model": "sign", "hops": 2, "norm": "layer", "residual": True}, True),
        ({"model": "sign", "hops": 2, "prune": "off"}, False),
        ({"model": "mlp", "norm": "batch"}, False),
        ({"model": "appnp", "hops": 2}, False),
        ({"model": "gcn"}, False),
    ],
)
def test_in_force_for_per_row_stacks_only(part, settings, restricted) -> None:
    tr = _trainer(part, **settings)
    assert (tr.train_rows is not None) == restricted
    if restricted:
        train = int(tr.data["train"].sum())
        assert tr.train_rows.rows.shape[0] == train < tr.data["x"].shape[0]
        assert tr.train_rows.ctx.blocks.num_rows == train
        seen = []
        hook = tr.model.layers[0].register_forward_hook(lambda m, a, out: seen.append(out))
        tr.train_step(1)
        hook.remove()
        assert seen[0].shape[0] == train  # the step computed the training rows alone


@pytest.mark.parametrize(
    "settings",
    [
        {"model": "mlp"},
        {"model": "sign", "hops": 2, "input_dropout": 0.2},
        {"model": "sgc", "layers": 1},
    ],
)
def test_same_numbers_as_every_row(part, settings) -> None:
    """Losses and parameters of 3 steps match ``--prune off`` to float rounding (the blocks'
    partials hold fewer rows), with the same dropout masks (keyed by node id)."""
    with one_thread():
        runs = []
        for prune in ("auto", "off"):
            tr = _trainer(part, prune=prune, **settings)
            losses = [tr.train_step(e).loss for e in (1, 2, 3)]
            runs.append((np.asarray(losses), parameter_vector(tr.model).detach().clone()))
    (la, pa), (lo, po) = runs
    np.testing.assert_allclose(la, lo, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pa, po, rtol=1e-4, atol=1e-5)


def test_restricted_layout_keeps_block_order_and_empty_blocks() -> None:
    # 7 rows in 3 blocks of a 3-block graph; block 1 keeps nothing
    rows, ptr = np.array([2, 0, 5, 1, 6, 3, 4]), np.array([0, 2, 4, 7])
    layout = BlockLayout(3, np.array([0, 1, 2]), rows, ptr)
    keep = np.array([0, 2, 3, 4])  # rows 1, 5, 6 dropped: block 1 (rows 5, 1) empty
    sub = layout.restricted(keep)
    assert sub.block_ids.tolist() == [0, 1, 2]
    assert sub.block_ptr.tolist() == [0, 2, 2, 4]
    # block 0 held rows 2, 0 -> new ids 1, 0; block 2 held 6, 3, 4 -> 3 -> 2, 4 -> 3
    assert sub.block_rows.tolist() == [1, 0, 2, 3]
    t = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    got = sub.partials(row_sum, t[torch.from_numpy(keep)]).root()  # the tree is complete
    torch.testing.assert_close(got, t[[2, 0]].sum(0) + t[[3, 4]].sum(0))
    with pytest.raises(ValueError, match="ascend"):
        layout.restricted(np.array([3, 1]))
    empty = layout.restricted(np.zeros(0, dtype=np.int64))
    assert empty.num_rows == 0 and empty.block_ptr.tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="at least one row"):
        BlockLayout(3, np.array([0, 1, 2]), np.arange(2), np.array([0, 1, 1, 2]))


@pytest.mark.timeout(240)
def test_blocks_without_training_rows_three_ranks_bit_for_bit(tmp_path: Path) -> None:
    """3% training nodes: most blocks hold none (they stay in the tree, empty); 3 ranks equal
    one process bit for bit."""
    graph = build_sbm_graph(train_fraction=0.03, name="sparse-train")
    models = ["sign;hops=2;input_dropout=0.2", "mlp;norm=layer"]
    whole = whole_graph_part(graph)
    tr = _trainer(whole, model="sign", hops=2)
    sizes = np.diff(tr.train_rows.ctx.blocks.block_ptr)
    assert (sizes == 0).sum() > len(sizes) // 2 and sizes.sum() > 0
    with one_thread():
        want = train_models(whole, Communicator(), models)
    parts = tmp_path / "parts"
    partition_graph(graph, 3, parts, method="metis", seed=0)
    got = run_task(
        bitwise_worker.bitwise,
        ranks=3,
        out=tmp_path / "result.npz",
        timeout=200,
        parts=parts,
        transports=["gloo"],
        models=models,
    )
    for model in models:
        for what in ("losses", "params"):
            a, b = got[f"gloo/{model}/{what}"], want[f"{model}/{what}"]
            assert np.array_equal(a, b), (model, what, float(np.abs(a - b).max()))
