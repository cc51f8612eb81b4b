"""Graph attention with rank-count-invariant gradients
(:mod:`fullgraph.distributed.ordered_attention`, its kernels
:mod:`fullgraph.kernels.edge_attention_ordered`): one process's output and input gradient equal
:func:`~fullgraph.kernels.edge_attention.edge_attention`'s (tested against plain autograd) to
rounding, with and without attention dropout, one and six heads (two hash words); at P = 2, 3,
4 both are one process's bits; the previous backward (halo gradients returned to their owners
and added there in rank order) is not, so the comparison can fail. Ranks are threads
(``test_ordered.run_ranks``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_ordered import RANKS, _by_global_id, _graph, run_ranks

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloExchange, HaloPlan
from fullgraph.distributed.ordered_attention import OrderedAttention
from fullgraph.kernels.attention_dropout import attention_keys
from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.edge_attention import edge_attention
from fullgraph.models.local_graph import local_csr
from fullgraph.partition import load_partition, partition_graph, whole_graph_part

CASES = [
    {"heads": 2, "width": 3, "p": 0.4},
    {"heads": 6, "width": 2, "p": 0.0},
]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The graph (hubs: sources with many destinations, on several ranks) and its random
    partitions."""
    graph = _graph()
    root = tmp_path_factory.mktemp("ordered-attention")
    paths = {}
    for p in RANKS:
        paths[p] = root / f"p{p}"
        partition_graph(graph, p, paths[p], method="random", seed=4)
    return {"graph": graph, "paths": paths}


def _inputs(n: int, case: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's ``[xp | asrc | adst]`` and output gradient, by global id."""
    heads, width = case["heads"], case["width"]
    g = torch.Generator().manual_seed(heads)
    rows = torch.randn(n, heads * (width + 2), generator=g, dtype=torch.float64)
    dy = torch.randn(n, heads * width, generator=g, dtype=torch.float64)
    return rows.to(dtype), dy.to(dtype)


def _one_rank(part, comm: Communicator, n: int, case: dict, dtype: torch.dtype) -> dict:
    """The ordered attention and its inner rows' gradient; the previous way's gradient
    (:func:`edge_attention` over ``[inner; halo]`` with the halo gradients sent back)."""
    heads, width, p = case["heads"], case["width"], case["p"]
    plan = HaloPlan.from_partition(part, comm)
    structure = local_csr(part)
    local_gids = np.asarray(part.global_ids, dtype=np.int64)
    gids = torch.from_numpy(local_gids[: part.num_inner].copy())
    graph = AttentionGraph.of(structure, local_gids)
    rows, dy = _inputs(n, case, dtype)
    keys = attention_keys(3, 1, 0, heads) if p > 0 else None
    sent = heads * (width + 1)
    inner = rows[gids].clone().requires_grad_(True)
    halo = None if comm.size == 1 else HaloExchange.apply(inner[:, :sent].detach(), plan)
    args = (heads, width, keys, p, 0.2)
    y = OrderedAttention.apply(inner, halo, graph, structure, plan, local_gids, *args)
    y.backward(dy[gids])
    out = {"gids": gids, "y": y.detach(), "dx": inner.grad}
    old = rows[gids].clone().requires_grad_(True)
    both = old[:, :sent]
    if comm.size > 1:
        both = torch.cat([both, HaloExchange.apply(both, plan)])
    y_old = edge_attention(
        both, old[:, sent:], graph, heads=heads, width=width, slope=0.2, p=p, keys=keys
    )
    y_old.backward(dy[gids])
    out["old_y"], out["old_dx"] = y_old.detach(), old.grad
    return out


@pytest.mark.parametrize("case", CASES, ids=["dropout", "six-heads"])
def test_one_process_equals_edge_attention(job, case: dict) -> None:
    """Forward and gradient equal the attention kernel's (float64: to 1e-10)."""
    graph = job["graph"]
    (one,) = run_ranks(
        1,
        lambda comm: _one_rank(whole_graph_part(graph), comm, graph.num_nodes, case, torch.float64),
    )
    torch.testing.assert_close(one["y"], one["old_y"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(one["dx"], one["old_dx"], rtol=1e-10, atol=1e-12)
    assert one["dx"].abs().max() > 0.1


@pytest.mark.parametrize("case", CASES, ids=["dropout", "six-heads"])
def test_ranks_equal_one_process_bitwise(job, case: dict) -> None:
    """Output and input gradient at P = 2, 3, 4 are one process's bits (float32); the old
    gradient differs from one process at some P (the control)."""
    graph, n = job["graph"], job["graph"].num_nodes
    (one,) = run_ranks(
        1,
        lambda comm: _one_rank(whole_graph_part(graph), comm, graph.num_nodes, case, torch.float32),
    )
    want_y, want_dx = _by_global_id([one], "y", n), _by_global_id([one], "dx", n)
    old_differs = []
    for p in RANKS:

        def task(comm: Communicator, p: int = p) -> dict:
            part = load_partition(job["paths"][p], comm.rank, mmap=False)
            return _one_rank(part, comm, n, case, torch.float32)

        results = run_ranks(p, task)
        for key, want in (("y", want_y), ("dx", want_dx)):
            differ = int((_by_global_id(results, key, n) != want).sum())
            assert differ == 0, f"P={p} {case}: {key} differs in {differ} entries"
        old_differs.append(bool((_by_global_id(results, "old_dx", n) != want_dx).any()))
    assert any(old_differs), "the previous backward equals one process at every P"
