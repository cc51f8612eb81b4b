"""The maximum over in-neighbours with a rank-count-invariant gradient
(:mod:`fullgraph.distributed.ordered_max`): the maxima and the input gradient at P = 2, 3, 4
equal one process's bit for bit (whole and sliced exchanges, with and without the overlap);
the previous gradient (each rank in local row order, owners adding halo gradients in rank
order) does not, so the comparison can fail. Ranks are threads (``test_ordered.run_ranks``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_ordered import RANKS, _by_global_id, _graph, _rows, run_ranks

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloExchange, HaloPlan
from fullgraph.distributed.ordered_max import HaloMax
from fullgraph.kernels import segment_max
from fullgraph.models.local_graph import local_csr
from fullgraph.partition import load_partition, partition_graph, whole_graph_part

HUBS = [7, 100, 250]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The graph, rows whose hubs are the maximum of most of their out-neighbours' rows (so
    many rows route their gradient to one source), and random partitions."""
    graph = _graph()
    root = tmp_path_factory.mktemp("ordered-max")
    paths = {}
    for p in RANKS:
        paths[p] = root / f"p{p}"
        partition_graph(graph, p, paths[p], method="random", seed=2)
    h = _rows(graph.num_nodes, 5)
    h[HUBS] = h.abs().max() * 2
    return {"graph": graph, "paths": paths, "h": h, "dy": _rows(graph.num_nodes, 6)}


def _one_rank(part, comm: Communicator, job: dict, case: dict) -> dict:
    plan = HaloPlan.from_partition(part, comm, buffer_bytes=case["buffer_bytes"])
    plan.overlap = case["overlap"]
    structure = local_csr(part)
    local_gids = np.asarray(part.global_ids, dtype=np.int64)
    gids = torch.from_numpy(local_gids[: part.num_inner].copy())
    h = job["h"][gids].clone().requires_grad_(True)
    y = HaloMax.apply(h, structure, plan, local_gids)
    y.backward(job["dy"][gids])
    out = {"gids": gids, "y": y.detach(), "dh": h.grad}
    old_h = job["h"][gids].clone().requires_grad_(True)
    rows = old_h if comm.size == 1 else torch.cat([old_h, HaloExchange.apply(old_h, plan)])
    segment_max(structure, rows, local_gids).backward(job["dy"][gids])
    out["old_dh"] = old_h.grad
    return out


@pytest.mark.parametrize(
    "case",
    [{"overlap": True, "buffer_bytes": 32 << 20}, {"overlap": False, "buffer_bytes": 4096}],
    ids=["whole", "sliced"],
)
def test_max_gradient_is_one_process_bitwise(job, case: dict) -> None:
    """Maxima and input gradients at P = 2, 3, 4 are one process's bits; the old gradient
    differs from one process at some P (the control)."""
    graph, n = job["graph"], job["graph"].num_nodes
    flat = whole_graph_part(graph, order="global")  # local id = global id: the old sums too
    (one,) = run_ranks(1, lambda comm: _one_rank(flat, comm, job, case))
    want_y, want_dh = _by_global_id([one], "y", n), _by_global_id([one], "dh", n)
    assert torch.equal(want_dh, _by_global_id([one], "old_dh", n))  # the same sums, one process
    (blocks,) = run_ranks(1, lambda comm: _one_rank(whole_graph_part(graph), comm, job, case))
    for key, want in (("y", want_y), ("dh", want_dh)):  # rows in block order: the same bits
        assert torch.equal(_by_global_id([blocks], key, n), want), key
    old_differs = []
    for p in RANKS:

        def task(comm: Communicator, p: int = p) -> dict:
            part = load_partition(job["paths"][p], comm.rank, mmap=False)
            return _one_rank(part, comm, job, case)

        results = run_ranks(p, task)
        for key, want in (("y", want_y), ("dh", want_dh)):
            differ = int((_by_global_id(results, key, n) != want).sum())
            assert differ == 0, f"P={p} {case}: {key} differs in {differ} entries"
        old_differs.append(bool((_by_global_id(results, "old_dh", n) != want_dh).any()))
    assert any(old_differs), "the rank-order gradient equals one process's: control is void"
