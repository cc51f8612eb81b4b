"""Link prediction trains bit-identical at any rank count: 4 epochs on P = 2 (mpi, gloo) and
P = 4 (mpi) equal one process on the whole graph (losses, final parameters ``torch.equal``,
the validation AUC), with the dot and the MLP decoder, full-batch and in edge batches with 2
negatives per positive, under dropout. Every node's gradient sums its pairs' terms in one
global order (:mod:`fullgraph.distributed.pair_rows`); the decoder's weight gradients and the
loss are per-block partials in the node tree. The negative control (the sums over nodes in
rank order) differs, so the test can fail.
"""

from __future__ import annotations

from pathlib import Path

import link_worker
import numpy as np
import pytest
import torch
from harness import run_task
from link_worker import link_split, train_links
from mp_utils import one_thread

from fullgraph.distributed.communicator import Communicator
from fullgraph.partition import whole_graph_part

MODELS = ["gcn", "sage;decoder=mlp;decoder_layers=2", "gcn;link_batch=300;neg_ratio=2"]
CONTROL = "gcn:rank-order"


@pytest.fixture(scope="module")
def reference(small_graph) -> dict[str, np.ndarray]:
    """One process on the whole graph."""
    with one_thread():
        return train_links(
            whole_graph_part(small_graph),
            Communicator(),
            [*MODELS, CONTROL],
            link_split(small_graph),
        )


def _check(result: dict, reference: dict, transports: list[str]) -> None:
    for model in MODELS:
        for transport in transports:
            key = f"{transport}/{model}"
            assert bool(result[f"{key}/blocks"]), f"{key}: the parts carry no blocks"
            for what in ("losses", "params", "val_auc"):
                got = torch.from_numpy(np.asarray(result[f"{key}/{what}"]))
                want = torch.from_numpy(np.asarray(reference[f"{model}/{what}"]))
                assert torch.equal(got, want), (key, what, float((got - want).abs().max()))
    got, want = result[f"{transports[0]}/{CONTROL}/params"], reference[f"{CONTROL}/params"]
    assert not np.array_equal(got, want), "the rank-order control is bitwise too"
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(300)
def test_two_ranks_equal_one_process_bit_for_bit(
    small_partitions, reference, tmp_path: Path
) -> None:
    result = run_task(
        link_worker.link,
        ranks=2,
        out=tmp_path / "result.npz",
        timeout=280,
        parts=small_partitions[2],
        transports=["mpi", "gloo"],
        models=[*MODELS, CONTROL],
    )
    _check(result, reference, ["mpi", "gloo"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_four_ranks_equal_one_process_bit_for_bit(
    small_partitions, reference, tmp_path: Path
) -> None:
    result = run_task(
        link_worker.link,
        ranks=4,
        out=tmp_path / "result.npz",
        timeout=380,
        parts=small_partitions[4],
        transports=["mpi"],
        models=[*MODELS, CONTROL],
    )
    _check(result, reference, ["mpi"])


def test_the_models_learn(reference) -> None:
    """Every model's training loss falls over the epochs (they train, not only agree)."""
    for model in MODELS:
        losses = reference[f"{model}/losses"]
        assert losses[-1] < losses[0], (model, losses)
