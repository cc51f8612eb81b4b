"""``fullgraph train --model gcn --edge-weight --improved``: P ranks equal one process.

The ``gcn`` kind weighs its edges with the partition's stored edge weights (global weighted
degrees from ``in_weight``, no set-up exchange) and / or fills its self-loops with 2; the
variants of ``train_worker.EDGE_VARIANTS`` (dropout on, with and without the precomputed first
aggregation, with ``--norm batch``) train on P = 1, 2, 4 ranks over mpi and gloo and their
first-step logits and gradients and every epoch's loss equal one process's on the whole graph.
(Against PyG's ``GCNConv``: ``tests/models/test_edge_parity.py``.)

Enters through :mod:`fullgraph.training.trainer`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import train_worker
from harness import assert_matches_one_process, run_task
from mp_utils import one_thread
from train_worker import EDGE_VARIANTS, STEP_TOLERANCES, run_variants

from fullgraph.datasets.synthetic import with_edge_values
from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.partition import partition_graph, whole_graph_part
from fullgraph.training import RunOptions, TrainConfig, Trainer

NAMES = [name for name, _, _ in EDGE_VARIANTS]


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def weighted(small_graph):
    return with_edge_values(small_graph, seed=7)


@pytest.fixture(scope="module")
def reference(weighted) -> dict[str, np.ndarray]:
    return run_variants(whole_graph_part(weighted), Communicator(), names=NAMES)


@pytest.fixture(scope="module")
def weighted_parts(weighted, tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("weighted-parts")
    paths = {}
    for P in (1, 2, 4):
        paths[P] = root / f"p{P}"
        partition_graph(weighted, P, paths[P], method="metis", seed=0)
    return paths


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("ranks", "transports"),
    [(1, "mpi"), (2, "mpi,gloo"), pytest.param(4, "mpi,gloo", marks=pytest.mark.slow)],
)
def test_ranks_equal_one_process(ranks, transports, weighted_parts, reference, tmp_path) -> None:
    result = run_task(
        train_worker.exact,
        ranks=ranks,
        out=tmp_path / "out.npz",
        timeout=280,
        parts=weighted_parts[ranks],
        transports=transports.split(","),
        variants=",".join(NAMES),
    )
    for transport in transports.split(","):
        got = {k.split("/", 1)[1]: result[k] for k in result if k.startswith(f"{transport}/")}
        assert_matches_one_process(
            got, reference, STEP_TOLERANCES, names=NAMES, where=f"P={ranks}, {transport}"
        )


def test_weights_change_the_model_and_are_required(weighted, small_graph) -> None:
    cfg = TrainConfig(model="gcn", epochs=2, edge_weight=True)
    losses = [
        Trainer(whole_graph_part(weighted), Communicator(), c, RunOptions(quiet=True))
        .train_step(1)
        .loss
        for c in (cfg, replace(cfg, edge_weight=False))
    ]
    assert losses[0] != losses[1]
    with pytest.raises(ConfigError, match="edge weights were asked for but the partition"):
        Trainer(whole_graph_part(small_graph), Communicator(), cfg, RunOptions(quiet=True))
    with pytest.raises(ConfigError, match="--edge-weight applies to --model gcn only"):
        TrainConfig(model="sage", edge_weight=True).check()


def test_export_refuses_a_weighted_gcn() -> None:
    from types import SimpleNamespace

    from fullgraph.training.export_pyg import init_args

    mf = SimpleNamespace(
        path="model.pt", config=TrainConfig(improved=True), num_features=4, num_classes=2
    )
    with pytest.raises(ConfigError, match="trained with --improved cannot be exported"):
        init_args(mf)
