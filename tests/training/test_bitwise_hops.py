"""SGC and SIGN train bit-identical at any rank count: 5 epochs on P = 2 ranks over mpi and gloo
equal one process on the whole graph (losses, final parameters ``torch.equal``), for every
propagation (``gcn``, ``mean``, ``sym``, ``ppr``), SIGN's inception layer with input dropout on
its hops, with ``--norm layer --residual``, with one layer, and under bf16-mixed. The hops are
exact by construction (:mod:`fullgraph.propagation.hops`); the layers after them are per row,
their weight and bias gradients summed in the block tree. The negative control, SIGN with its
sums over nodes in rank order, differs (the test can fail).

Enters through :mod:`fullgraph.training.trainer`.
"""

from __future__ import annotations

from pathlib import Path

import bitwise_worker
import numpy as np
import pytest
import torch
from bitwise_worker import train_models
from harness import run_task
from mp_utils import one_thread

from fullgraph.distributed.communicator import Communicator
from fullgraph.partition import whole_graph_part

MODELS = [
    "sgc;layers=1",
    "sgc;propagation=mean;input_dropout=0.3",
    "sign;hops=2",
    "sign;hops=2;propagation=ppr;alpha=0.2",
    "sign;hops=2;propagation=gcn;norm=layer;residual=true",
    "sign;hops=3;layers=1;input_dropout=0.2",
    "sign;hops=2;precision=bf16-mixed",
]
CONTROL = "sign:rank-order;hops=2"


@pytest.fixture(scope="module")
def reference(small_graph) -> dict[str, np.ndarray]:
    """One process on the whole graph."""
    with one_thread():
        return train_models(whole_graph_part(small_graph), Communicator(), [*MODELS, CONTROL])


@pytest.mark.timeout(240)
def test_two_ranks_equal_one_process_bit_for_bit(
    small_partitions, reference, tmp_path: Path
) -> None:
    result = run_task(
        bitwise_worker.bitwise,
        ranks=2,
        out=tmp_path / "result.npz",
        timeout=200,
        parts=small_partitions[2],
        transports=["mpi", "gloo"],
        models=[*MODELS, CONTROL],
    )
    for model in MODELS:
        for transport in ("mpi", "gloo"):
            key = f"{transport}/{model}"
            assert bool(result[f"{key}/blocks"]), f"{key}: the parts carry no blocks"
            for what in ("losses", "params"):
                got = torch.from_numpy(result[f"{key}/{what}"])
                want = torch.from_numpy(reference[f"{model}/{what}"])
                assert torch.equal(got, want), (key, what, float((got - want).abs().max()))
    got, want = result[f"mpi/{CONTROL}/params"], reference[f"{CONTROL}/params"]
    assert not np.array_equal(got, want), "the rank-order control is bitwise too"
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_models_learn(reference) -> None:
    """Every model's loss falls over the 5 epochs (they train, not only agree)."""
    for model in MODELS:
        losses = reference[f"{model}/losses"]
        assert losses[-1] < losses[0], (model, losses)
