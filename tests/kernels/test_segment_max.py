"""The max aggregation (``fullgraph.kernels.segment_max``) against a plain loop written here.

Both back-ends (numba on CPU, torch anywhere) give the reference's maxima and argmax, and its
gradient, on a CSR with empty rows, a hub, duplicate entries and many ties (small integer
values); ties go to the lowest key, so permuting the rows of ``h`` (a rank's local ids) with
their keys (the global ids) changes nothing; without ties the gradient equals torch's own
``scatter_reduce("amax")`` autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fullgraph.kernels import CSRMatrix, segment_max
from fullgraph.kernels.segment_max import segment_max_numba, segment_max_torch


def segment_max_reference(
    indptr: np.ndarray, indices: np.ndarray, h: np.ndarray, key: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(out, arg)`` by a plain loop: per row and column, the largest value, ties to the
    lowest key; an empty row is 0 with argmax -1."""
    n, width = len(indptr) - 1, h.shape[1]
    out = np.zeros((n, width), dtype=h.dtype)
    arg = np.full((n, width), -1, dtype=np.int64)
    for i in range(n):
        cands = sorted(set(indices[indptr[i] : indptr[i + 1]].tolist()), key=lambda j: key[j])
        for f in range(width):
            best = None
            for j in cands:  # in key order: a later equal value never wins
                if best is None or h[j, f] > h[best, f]:
                    best = j
            if best is not None:
                out[i, f], arg[i, f] = h[best, f], best
    return out, arg


def _graph(rng: np.random.Generator, rows: int, cols: int) -> CSRMatrix:
    """Random rows with some empty, one hub reading half the columns, duplicate entries."""
    counts = rng.integers(0, 5, rows)
    counts[rng.choice(rows, rows // 5, replace=False)] = 0
    counts[1] = cols // 2
    indices = [rng.integers(0, cols, c) for c in counts]
    indices[2] = np.array([3, 3, 5, 3])  # duplicates of one column
    counts[2] = 4
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return CSRMatrix(
        torch.from_numpy(indptr),
        torch.from_numpy(np.concatenate(indices).astype(np.int64)),
        None,
        cols,
    )


CASES = [  # (rows, cols, width, values drawn from integers below: ties)
    (40, 60, 5, 3),
    (7, 30, 1, 2),
    (25, 25, 17, 1000),
]


@pytest.mark.parametrize(("rows", "cols", "width", "levels"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_forward_and_gradient_equal_the_loop(rows, cols, width, levels, dtype, backend) -> None:
    rng = np.random.default_rng(rows + width)
    a = _graph(rng, rows, cols)
    h = torch.from_numpy(rng.integers(-levels, levels, (cols, width)).astype(np.float64))
    h = h.to(dtype)
    key = torch.from_numpy(rng.permutation(10 * cols)[:cols].astype(np.int64))
    want, want_arg = segment_max_reference(
        a.indptr.numpy(), a.indices.numpy(), h.numpy(), key.numpy()
    )
    run = segment_max_numba if backend == "numba" else segment_max_torch
    out, arg = run(a, h, key, torch.int32)
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(arg.numpy(), want_arg)
    # the autograd function (the back-end the device picks) and its routed gradient
    x = h.clone().requires_grad_(True)
    y = segment_max(a, x, key)
    np.testing.assert_array_equal(y.detach().numpy(), want)
    g = torch.randn(y.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    y.backward(g)
    dh = np.zeros_like(h.numpy())
    for i, f in zip(*np.nonzero(want_arg >= 0), strict=True):
        dh[want_arg[i, f], f] += g[i, f].item()
    np.testing.assert_allclose(x.grad.numpy(), dh, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_ties_follow_the_keys_under_any_local_order(backend) -> None:
    """A rank's local ids are a permutation of one process's: the keys make both agree."""
    rng = np.random.default_rng(7)
    a = _graph(rng, 30, 40)
    h = torch.from_numpy(rng.integers(0, 2, (40, 6)).astype(np.float32))
    key = torch.arange(40, dtype=torch.int64)
    perm = torch.from_numpy(rng.permutation(40))  # local id p holds global row perm[p]
    inv = torch.argsort(perm)
    a_local = CSRMatrix(a.indptr, inv[a.indices], None, 40)
    run = segment_max_numba if backend == "numba" else segment_max_torch
    out, arg = run(a, h, key, torch.int64)
    out_p, arg_p = run(a_local, h[perm], key[perm], torch.int64)
    torch.testing.assert_close(out_p, out, rtol=0, atol=0)
    chosen = torch.where(arg_p >= 0, perm[arg_p.clamp(min=0)], -1)
    torch.testing.assert_close(chosen, arg, rtol=0, atol=0)
    x, xp = h.clone().requires_grad_(True), h[perm].clone().requires_grad_(True)
    g = torch.randn(out.shape)
    segment_max(a, x, key).backward(g)
    segment_max(a_local, xp, key[perm]).backward(g)
    torch.testing.assert_close(xp.grad, x.grad[perm], rtol=0, atol=0)


def test_without_ties_the_gradient_is_torchs() -> None:
    rng = np.random.default_rng(3)
    a = _graph(rng, 50, 50)
    a = CSRMatrix(a.indptr, a.indices, None, 50)
    h = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    rows, cols = a.row_of_entry(), a.indices
    index = rows[:, None].expand(-1, 8)
    want = torch.zeros(50, 8, dtype=torch.float64).scatter_reduce(
        0, index, h[cols], "amax", include_self=False
    )
    got = segment_max(a, h, np.arange(50))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn(50, 8, dtype=torch.float64)
    (dh_want,) = torch.autograd.grad(want, h, g)
    (dh_got,) = torch.autograd.grad(got, h, g)
    # duplicate entries: torch splits the gradient over the copies of one row, we send it once
    torch.testing.assert_close(dh_got, dh_want, rtol=1e-12, atol=1e-12)


def test_shapes_are_checked() -> None:
    a = CSRMatrix(torch.tensor([0, 1]), torch.tensor([0]), None, 3)
    with pytest.raises(ValueError, match="2 rows of h for 3 columns"):
        segment_max(a, torch.zeros(2, 1), np.arange(2))
    with pytest.raises(ValueError, match="2 keys for 3 columns"):
        segment_max(a, torch.zeros(3, 1), np.arange(2))
