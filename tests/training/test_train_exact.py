"""Distributed training equals one process: P = 1, 2, 4 ranks, mpi and gloo, GCN, SAGE, GAT, GIN,
GraphConv.

Each (P, transport) is one ``mpirun`` launch running every variant of ``train_worker.VARIANTS``
(dropout on; with and without the precomputed first aggregation; GAT with attention dropout on,
exchanging its input and its projected rows, and with ``--norm batch`` and ``--residual``;
GCN with ``--norm batch``, SAGE with ``--norm layer --residual``; SAGE without receptive-field
pruning, which the pruned ranks must equal as well; GIN with and without the precomputed first
aggregation; SAGE and GraphConv with ``--aggr max``, GraphConv with its sum). The
reference runs the same code in this process on the whole graph.

Enters through :mod:`fullgraph.training.trainer`.
"""

from __future__ import annotations

import numpy as np
import pytest
import train_worker
from harness import assert_matches_one_process, run_task
from mp_utils import one_thread
from train_worker import STEP_TOLERANCES, VARIANTS, run_variants

from fullgraph.distributed.communicator import Communicator
from fullgraph.partition import whole_graph_part

PRUNED_TOLERANCES = {"grads": (1e-5, 1e-6), "losses": (1e-5, 1e-6)}


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def reference(small_graph) -> dict[str, np.ndarray]:
    """One-process logits, gradients and losses of every variant."""
    return run_variants(whole_graph_part(small_graph), Communicator())


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("ranks", "transports"),
    [(1, "mpi"), (2, "mpi,gloo"), pytest.param(4, "mpi", marks=pytest.mark.slow)],
)
def test_distributed_matches_one_process(
    ranks: int, transports: str, small_partitions, reference, tmp_path
) -> None:
    result = run_task(
        train_worker.exact,
        ranks=ranks,
        out=tmp_path / "result.npz",
        timeout=200,
        parts=small_partitions[ranks],
        transports=transports.split(","),
    )
    for transport in transports.split(","):
        assert bool(result[f"{transport}/halo_exchange_ok"]), f"HaloExchange on {transport}"
    names = [name for name, _, _ in VARIANTS]
    for transport in transports.split(","):
        got = {k.split("/", 1)[1]: result[k] for k in result if k.startswith(f"{transport}/")}
        where = f"P={ranks}, {transport}"
        assert_matches_one_process(got, reference, STEP_TOLERANCES, names=names, where=where)
        pruned = {what: got[f"sage/{what}"] for what in PRUNED_TOLERANCES}
        unpruned = {what: reference[f"sage_unpruned/{what}"] for what in PRUNED_TOLERANCES}
        assert_matches_one_process(  # pruned ranks == one unpruned process
            pruned, unpruned, PRUNED_TOLERANCES, where=f"receptive-field pruning, {where}"
        )


def test_reference_is_not_trivial(reference) -> None:
    """The comparison means something: losses fall and gradients are not zero."""
    for name, _, _ in VARIANTS:
        losses = reference[f"{name}/losses"]
        assert losses[-1] < losses[0], name
        assert np.abs(reference[f"{name}/grads"]).max() > 1e-4, name
