"""Distributed training equals one process: P = 1, 2, 4 ranks, mpi and gloo, GCN, SAGE, GAT, GIN,
GraphConv.

Each (P, transport) is one ``mpirun`` launch running every variant of ``train_worker.VARIANTS``
(dropout on; with and without the precomputed first aggregation; GAT with attention dropout on,
exchanging its input and its projected rows, and with ``--norm batch`` and ``--residual``;
GCN with ``--norm batch``, SAGE with ``--norm layer --residual``; SAGE without receptive-field
pruning, which the pruned ranks must equal as well; GIN with and without the precomputed first
aggregation; SAGE and GraphConv with ``--aggr max``, GraphConv with its sum). The
reference runs the same code in this process on the whole graph.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import train_worker
from harness import run_task
from mp_utils import one_thread
from train_worker import VARIANTS, run_variants

from fullgraph.distributed.communicator import Communicator
from fullgraph.partition import whole_graph_part


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
    [(1, "mpi"), (2, "mpi,gloo"), pytest.param(4, "mpi,gloo", marks=pytest.mark.slow)],
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
    for transport, (name, _, _) in itertools.product(transports.split(","), VARIANTS):
        got = {k.split("/", 1)[1]: result[k] for k in result if k.startswith(transport)}
        np.testing.assert_allclose(
            got[f"{name}/logits"],
            reference[f"{name}/logits"],
            rtol=1e-5,
            atol=1e-5,
            err_msg=f"{name}: step-1 logits (P={ranks}, {transport})",
        )
        np.testing.assert_allclose(
            got[f"{name}/grads"],
            reference[f"{name}/grads"],
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"{name}: step-1 parameter gradients (P={ranks}, {transport})",
        )
        np.testing.assert_allclose(
            got[f"{name}/losses"],
            reference[f"{name}/losses"],
            rtol=1e-4,
            err_msg=f"{name}: losses of {len(reference[f'{name}/losses'])} epochs",
        )
    for transport in transports.split(","):  # pruned ranks == one unpruned process
        for what in ("grads", "losses"):
            np.testing.assert_allclose(
                result[f"{transport}/sage/{what}"],
                reference[f"sage_unpruned/{what}"],
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"receptive-field pruning: {what} (P={ranks}, {transport})",
            )


def test_reference_is_not_trivial(reference) -> None:
    """The comparison means something: losses fall and gradients are not zero."""
    for name, _, _ in VARIANTS:
        losses = reference[f"{name}/losses"]
        assert losses[-1] < losses[0], name
        assert np.abs(reference[f"{name}/grads"]).max() > 1e-4, name
