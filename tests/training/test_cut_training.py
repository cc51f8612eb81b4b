"""Training on a receptive-field cut is training on the whole graph, bit for bit: 2-layer GCN,
GAT (2 heads), SAGE (mean and max), dropout on, 5 epochs, on the 2-hop cut of the training nodes
at P = 1 (in process) and P = 2 (mpi): losses and parameters ``torch.equal`` to one process on
the whole graph. The control: the cut's block partials over its own rows (no zero rows where the
cut dropped nodes) are not the whole graph's bits.

The partition comes from ``fullgraph.partition.receptive_cut``.

Enters through :mod:`fullgraph.training.trainer`.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import bitwise_worker
import numpy as np
import pytest
from bitwise_worker import train_models
from conftest import build_sbm_graph
from harness import run_task
from mp_utils import one_thread

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.tree_sum import BlockLayout
from fullgraph.partition import load_partition, partition_graph
from fullgraph.partition.receptive_cut import CutSpec

MODELS = ["gcn;hidden=64", "gat;heads=2;hidden=32", "sage;hidden=64", "sage;aggr=max;hidden=64"]
#: blocks large enough that a block's product and row sums take torch's blocked kernels
BLOCK = 512


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The whole graph in one part and its 2-hop training cut in 1 and 2 parts."""
    graph = build_sbm_graph(
        num_nodes=3000, avg_degree=3.0, num_features=32, train_fraction=0.03, name="cut-train"
    )
    root = tmp_path_factory.mktemp("cut-parts")
    out = {"whole": root / "whole-1", "cut-1": root / "cut-1", "cut-2": root / "cut-2"}
    partition_graph(graph, 1, out["whole"], block_size=BLOCK)
    for p in (1, 2):
        meta = partition_graph(
            graph, p, out[f"cut-{p}"], block_size=BLOCK, cut=CutSpec(2, ("train",))
        )
    assert meta["cut"]["num_nodes"] < 0.8 * graph.num_nodes  # the cut cuts
    return out


@pytest.fixture(scope="module")
def reference(parts: dict[str, Path]) -> dict[str, np.ndarray]:
    with one_thread():
        return train_models(load_partition(parts["whole"], 0), Communicator(), MODELS)


def _equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray], prefix: str = "") -> None:
    for model in MODELS:
        for what in ("losses", "params"):
            a, b = got[f"{prefix}{model}/{what}"], want[f"{model}/{what}"]
            assert np.array_equal(a, b), (prefix, model, what, float(np.abs(a - b).max()))


def test_one_process_on_the_cut_is_the_whole_graph(parts, reference) -> None:
    part = load_partition(parts["cut-1"], 0)
    assert np.any(part.block_full > np.diff(part.block_ptr))  # blocks lost rows
    with one_thread():
        _equal(train_models(part, Communicator(), MODELS), reference)


def test_the_control_without_zero_rows_differs(parts, reference) -> None:
    part = load_partition(parts["cut-1"], 0)
    whole_rows = mock.patch.object(
        BlockLayout, "_cut_pads", lambda self: [None] * len(self.block_ids)
    )
    with one_thread(), whole_rows:
        got = train_models(part, Communicator(), MODELS[:1])
    model = MODELS[0]
    assert not np.array_equal(got[f"{model}/params"], reference[f"{model}/params"])
    assert np.allclose(got[f"{model}/losses"], reference[f"{model}/losses"], rtol=1e-5)


@pytest.mark.timeout(240)
def test_two_ranks_on_the_cut_are_the_whole_graph(parts, reference, tmp_path) -> None:
    result = run_task(
        bitwise_worker.bitwise,
        ranks=2,
        out=tmp_path / "result.npz",
        timeout=200,
        parts=parts["cut-2"],
        transports=["mpi"],
        models=MODELS,
    )
    _equal(result, reference, "mpi/")
