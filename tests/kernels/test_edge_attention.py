"""The attention kernels (``fullgraph.kernels.edge_attention``) against a plain-torch reference.

Both back-ends (numba on CPU, torch anywhere) give the forward and the gradients of
:func:`edge_attention_reference` (plain autograd, written here) on a graph with halo columns,
isolated rows, a hub and more than four heads (two hash words), with and without attention
dropout; the mask equals a Python-integer splitmix64 of the edge's global ids.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from fullgraph.hashing import MASK64, splitmix64
from fullgraph.kernels import CSRMatrix
from fullgraph.kernels.attention_dropout import attention_keep, attention_keys
from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.edge_attention import edge_attention


def edge_attention_reference(
    rows: torch.Tensor,
    adst: torch.Tensor | None,
    graph: AttentionGraph,
    *,
    heads: int,
    width: int,
    slope: float = 0.2,
    p: float = 0.0,
    keys: np.ndarray | None = None,
) -> torch.Tensor:
    """:func:`edge_attention` in plain differentiable torch (autograd keeps every edge tensor).

    The reference the kernels are tested against; same arguments and result. The row layout
    is written out: ``[xp | a_src . xp | a_dst . xp (when adst is None) | ...]``.
    """
    hc = heads * width
    if adst is None:
        adst = rows[: graph.num_inner, hc + heads : hc + 2 * heads]
    xp, asrc = rows[:, :hc], rows[:, hc : hc + heads]
    r, c = graph.edges_with_loops(rows.device)
    s = F.leaky_relu(asrc[c] + adst[r], slope)
    index = r[:, None].expand(-1, heads)
    rmax = torch.full((graph.num_inner, heads), -torch.inf, dtype=rows.dtype, device=rows.device)
    rmax = rmax.scatter_reduce(0, index, s.detach(), "amax", include_self=True)
    q = torch.exp(s - rmax[r])
    den = torch.zeros_like(rmax).index_add(0, r, q)
    alpha = q / den[r]
    if p > 0:
        gids = graph.gids_tensor(rows.device)
        keep = attention_keep(gids[r], gids[c], keys, heads, p)
        alpha = alpha * keep.to(alpha.dtype) / (1.0 - p)
    msg = alpha[:, :, None] * xp.reshape(-1, heads, width)[c]
    out = torch.zeros((graph.num_inner, heads, width), dtype=rows.dtype, device=rows.device)
    return out.index_add(0, r, msg).view(graph.num_inner, heads * width)


def _graph(num_inner: int = 120, num_halo: int = 40, seed: int = 0) -> CSRMatrix:
    """Rows = inner nodes, columns = inner + halo; row 0 a hub, the last 5 rows empty."""
    rng = np.random.default_rng(seed)
    n = num_inner + num_halo
    m = 6 * num_inner
    dst = rng.integers(0, num_inner - 5, m)
    src = rng.integers(0, n, m)
    dst = np.concatenate([dst, np.zeros(n, np.int64)])
    src = np.concatenate([src, np.arange(n)])
    a = sp.csr_matrix((np.ones(dst.size, bool), (dst, src)), shape=(num_inner, n))
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    return CSRMatrix(a.indptr.astype(np.int64), a.indices.astype(np.int64), None, n)


@pytest.fixture(params=["numba", "torch"])
def backend(request, monkeypatch) -> str:
    monkeypatch.setenv("FULLGRAPH_KERNEL", "cpu" if request.param == "numba" else "torch")
    return request.param


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("heads", "width"), [(1, 7), (3, 4), (6, 2)])
@pytest.mark.parametrize("p", [0.0, 0.4])
@pytest.mark.parametrize("dst_in_rows", [False, True])
def test_kernel_equals_reference(
    backend, dtype, heads: int, width: int, p: float, dst_in_rows: bool
) -> None:
    structure = _graph()
    n = structure.num_cols
    gids = np.random.default_rng(1).permutation(10 * n)[:n].astype(np.int64)
    graph = AttentionGraph.of(structure, gids)
    torch.manual_seed(0)
    # projected rows, source terms, [destination terms,] then a column the kernels must ignore
    cols = heads * (width + (2 if dst_in_rows else 1)) + 1
    rows = torch.randn(n, cols, dtype=torch.float64)
    adst = torch.randn(structure.num_rows, heads, dtype=torch.float64)
    keys = attention_keys(5, 2, 1, heads)
    ins = [t.to(dtype).clone().requires_grad_(True) for t in (rows, adst)]
    refs = [t.clone().requires_grad_(True) for t in (rows, adst)]
    args = {"heads": heads, "width": width, "p": p, "keys": keys}
    if dst_in_rows:
        ins, refs = ins[:1], refs[:1]
        out = edge_attention(ins[0], None, graph, **args)
        want = edge_attention_reference(refs[0], None, graph, **args)
    else:
        out = edge_attention(*ins, graph, **args)
        want = edge_attention_reference(*refs, graph, **args)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(out.double(), want, **tol)
    w = torch.randn_like(want)
    (out * w.to(dtype)).sum().backward()
    (want * w).sum().backward()
    for a, b in zip(ins, refs, strict=True):
        torch.testing.assert_close(a.grad.double(), b.grad, **tol)
    assert not ins[0].grad[:, -1].any()


def test_mask_is_the_documented_hash() -> None:
    keys = attention_keys(7, 3, 2, 6)
    dst = np.array([0, 5, 123456789, 2**40 + 3, 17], dtype=np.int64)
    src = np.array([0, 9, 42, 2**40 + 3, 123456789], dtype=np.int64)
    p = 0.3
    got = attention_keep(torch.from_numpy(dst), torch.from_numpy(src), keys, 6, p).numpy()
    for e in range(len(dst)):
        for h in range(6):
            z = splitmix64(splitmix64(int(keys[h // 4]) ^ int(dst[e])) ^ int(src[e])) & MASK64
            lane = (z >> (16 * (h % 4))) & 0xFFFF
            assert got[e, h] == (lane >= round(p * 65536))


def test_mask_drops_about_p() -> None:
    dst = torch.arange(20000)
    keep = attention_keep(dst, (dst * 7 + 3) % 20000, attention_keys(0, 1, 0, 4), 4, 0.6)
    assert abs(1 - keep.double().mean().item() - 0.6) < 0.01


def test_input_self_loops_are_replaced_by_one() -> None:
    """A structure with its own self-loops gives what the one without them gives (PyG removes
    them and adds one per node)."""
    base = _graph(num_inner=30, num_halo=5)
    a = base.to_scipy().tolil()
    a.setdiag(True)
    looped = sp.csr_matrix(a)
    looped.sort_indices()
    with_loops = CSRMatrix(
        looped.indptr.astype(np.int64), looped.indices.astype(np.int64), None, base.num_cols
    )
    rows = torch.randn(base.num_cols, 8, dtype=torch.float64)
    adst = torch.randn(30, 2, dtype=torch.float64)
    one = edge_attention(rows, adst, AttentionGraph.of(base, None), heads=2, width=3)
    two = edge_attention(rows, adst, AttentionGraph.of(with_loops, None), heads=2, width=3)
    torch.testing.assert_close(one, two)


def test_graph_is_kept_with_its_structure() -> None:
    """One AttentionGraph per structure and global ids; other ids or structures get their own."""
    structure = _graph(num_inner=20, num_halo=4)
    gids = np.arange(structure.num_cols, dtype=np.int64) * 3
    graph = AttentionGraph.of(structure, gids)
    assert AttentionGraph.of(structure, gids) is graph
    other = AttentionGraph.of(structure, gids.copy())
    assert other is not graph
    np.testing.assert_array_equal(other.global_ids, gids)
    assert AttentionGraph.of(_graph(num_inner=20, num_halo=4), None) is not other
