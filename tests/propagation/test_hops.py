"""The hops ``[X, A X, ..., A^K X]`` of every propagation: P = 2 and 3 ranks over mpi and gloo
equal one process bit for bit (``torch.equal``), and one process equals PyG (1e-6): the SIGN
transform for ``sym``, ``SGConv``'s propagation for ``gcn``, ``APPNP`` for ``ppr``, the mean
aggregation for ``mean``; bad input refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import hops_worker
import numpy as np
import pytest
import torch
from harness import run_task
from hops_worker import ALPHA, rank_hops
from mp_utils import one_thread

from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.models.local_graph import as_tensor
from fullgraph.partition import partition_graph, whole_graph_part
from fullgraph.propagation.hops import propagate_hops

PROPAGATIONS = ["gcn", "mean", "ppr", "sym"]
HOPS = 3


@pytest.fixture(scope="module")
def reference(small_graph) -> dict[str, np.ndarray]:
    """One process on the whole graph (its rows in block order, gathered to global order)."""
    part, comm = whole_graph_part(small_graph), Communicator()
    with one_thread():
        return {p: rank_hops(part, comm, p, HOPS) for p in PROPAGATIONS}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_equal_one_process_bit_for_bit(
    ranks: int, small_graph, reference, tmp_path: Path
) -> None:
    parts = tmp_path / f"parts-{ranks}"
    partition_graph(small_graph, ranks, parts, method="metis", seed=0)
    got = run_task(
        hops_worker.hops,
        ranks=ranks,
        out=tmp_path / "hops.npz",
        timeout=200,
        parts=parts,
        transports=["mpi", "gloo"],
        propagations=PROPAGATIONS,
        hops=HOPS,
    )
    for transport in ("mpi", "gloo"):
        for p in PROPAGATIONS:
            mine = torch.from_numpy(got[f"{transport}/{p}"])
            want = torch.from_numpy(reference[p])
            assert torch.equal(mine, want), f"P={ranks} {transport} {p}: {_worst(mine, want)}"


def _worst(a: torch.Tensor, b: torch.Tensor) -> str:
    return f"max |diff| {float((a - b).abs().max()):.3g}"


def test_the_hops_are_not_alike_and_grow_smoother(reference) -> None:
    """Each hop differs from the last (the comparison above compares something), and the
    operators differ from each other."""
    f = 12
    for p, rows in reference.items():
        hops = [rows[:, k * f : (k + 1) * f] for k in range(HOPS + 1)]
        for a, b in zip(hops[:-1], hops[1:], strict=True):
            assert not np.allclose(a, b), p
    assert not np.allclose(reference["gcn"], reference["sym"])
    assert not np.allclose(reference["gcn"], reference["ppr"])


def _pyg_data(small_graph):
    from fullgraph.datasets import to_pyg

    data = to_pyg(small_graph)
    return data


def _ours(small_graph, propagation: str) -> np.ndarray:
    """One process, rows in global order (``order="global"``: PyG's)."""
    part = whole_graph_part(small_graph, order="global")
    return rank_hops(part, Communicator(), propagation, HOPS)


def test_sym_equals_pyg_sign_transform(small_graph) -> None:
    transforms = pytest.importorskip("torch_geometric.transforms")
    data = transforms.SIGN(HOPS)(_pyg_data(small_graph))
    want = torch.cat([data.x] + [data[f"x{k}"] for k in range(1, HOPS + 1)], dim=1)
    got = torch.from_numpy(_ours(small_graph, "sym"))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_gcn_and_ppr_equal_pyg_propagation(small_graph) -> None:
    """``gcn``: SGConv's hops (``SGConv(K=k)`` with the identity weight, no bias); ``ppr``:
    PyG's ``APPNP(K, alpha)`` after every step count."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    data = _pyg_data(small_graph)
    f = data.x.shape[1]
    gcn = torch.from_numpy(_ours(small_graph, "gcn"))
    ppr = torch.from_numpy(_ours(small_graph, "ppr"))
    for k in range(1, HOPS + 1):
        sgc = pyg_nn.SGConv(f, f, K=k, bias=False)
        with torch.no_grad():
            sgc.lin.weight.copy_(torch.eye(f))
            want = sgc(data.x, data.edge_index)
        torch.testing.assert_close(gcn[:, k * f : (k + 1) * f], want, rtol=1e-6, atol=1e-6)
        want = pyg_nn.APPNP(K=k, alpha=ALPHA)(data.x, data.edge_index)
        torch.testing.assert_close(ppr[:, k * f : (k + 1) * f], want, rtol=1e-6, atol=1e-6)


def test_mean_equals_the_neighbour_mean(small_graph) -> None:
    """``mean``: PyG's ``MeanAggregation`` over the incoming neighbours, hop after hop."""
    aggr = pytest.importorskip("torch_geometric.nn.aggr")
    data = _pyg_data(small_graph)
    f = data.x.shape[1]
    got = torch.from_numpy(_ours(small_graph, "mean"))
    src, dst = data.edge_index
    h = data.x
    for k in range(1, HOPS + 1):
        h = aggr.MeanAggregation()(h[src], dst, dim_size=data.num_nodes)
        torch.testing.assert_close(got[:, k * f : (k + 1) * f], h, rtol=1e-6, atol=1e-6)


def test_keep_last_and_out_give_the_same_bits(small_graph) -> None:
    """``keep="last"`` is the last of ``all``; ``out`` holds the very hops."""
    from fullgraph.distributed.halo import HaloPlan
    from fullgraph.propagation.operators import propagation_operator

    part, comm = whole_graph_part(small_graph), Communicator()
    plan, op = HaloPlan.from_partition(part, comm), propagation_operator(part, "gcn")
    x = as_tensor(part.x, np.float32)
    every = propagate_hops(x, op, plan, HOPS)
    (last,) = propagate_hops(x, op, plan, HOPS, keep="last")
    assert torch.equal(last, every[-1])
    out = torch.empty((x.shape[0], (HOPS + 1) * x.shape[1]))
    views = propagate_hops(x, op, plan, HOPS, out=out)
    assert torch.equal(out, torch.cat(every, dim=1))
    assert all(v.data_ptr() >= out.data_ptr() for v in views)
    seen: list[tuple[int, int]] = []
    propagate_hops(x, op, plan, 2, progress=lambda k, n, s, b: seen.append((k, n)))
    assert seen == [(1, 2), (2, 2)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hops": 0}, "--hops must be at least 1, not 0"),
        ({"hops": 2, "propagation": "ppr"}, "--propagation ppr needs --alpha in (0, 1]"),
        ({"hops": 2, "propagation": "ppr", "alpha": 1.5}, "needs --alpha in (0, 1], not 1.5"),
        ({"hops": 2, "keep": "first"}, "keep must be one of all, last"),
    ],
)
def test_bad_input_is_refused(small_graph, kwargs: dict, message: str) -> None:
    from fullgraph.distributed.halo import HaloPlan
    from fullgraph.propagation.operators import propagation_operator

    part, comm = whole_graph_part(small_graph), Communicator()
    plan, op = HaloPlan.from_partition(part, comm), propagation_operator(part, "gcn")
    x = as_tensor(part.x, np.float32)
    hops = kwargs.pop("hops")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        propagate_hops(x, op, plan, hops, **kwargs)
