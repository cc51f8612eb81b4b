"""Parity of ``spmm`` (forward and gradient) on every back-end against a dense reference.

Back-ends: ``torch`` (reference), ``cpu`` with each implementation (``numba`` and FBGEMM's
``embedding_bag``), ``triton`` (Triton's interpreter on CPU tensors, so shapes stay small for
it). The reference is written here: a dense float64 matrix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fullgraph.kernels import CSRMatrix, spmm
from fullgraph.kernels.spmm import spmm_ordered_

BACKENDS = ["torch", "cpu-numba", "cpu-embedding_bag", "triton"]
WIDTHS = [1, 3, 17, 128, 300]
# (dtype, atol, rtol) of the comparison with the float64 reference.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (5e-2, 2e-2)}


def use_backend(monkeypatch, name: str) -> None:
    """Force back-end ``name`` (``cpu-<impl>`` also picks the CPU implementation)."""
    kernel, _, impl = name.partition("-")
    monkeypatch.setenv("FULLGRAPH_KERNEL", kernel)
    monkeypatch.setenv("FULLGRAPH_CPU_SPMM", impl or "numba")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch) -> str:
    use_backend(monkeypatch, request.param)
    return request.param


def make_case(name: str, index_dtype: np.dtype, backend: str, seed: int = 0):
    """(indptr, indices, values, num_rows, num_cols) of a named test matrix."""
    rng = np.random.default_rng(seed)
    if name == "hub":
        # One row holds most non-zeros: 100k neighbours (2000 under the Triton interpreter).
        hub = 2_000 if backend == "triton" else 100_000
        num_rows, num_cols = 4, hub + 5
        rows = [rng.choice(num_cols, hub, replace=False), [], [1, 2], [hub + 4]]
    elif name == "no_nnz":
        num_rows, num_cols = 5, 7
        rows = [[] for _ in range(num_rows)]
    else:
        num_rows, num_cols = {"rectangular": (12, 29), "empty_rows": (23, 23)}.get(name, (19, 19))
        density = 0.2
        rows = [np.flatnonzero(rng.random(num_cols) < density) for _ in range(num_rows)]
        if name == "empty_rows":
            for r in (0, 5, 6, 7, num_rows - 1):
                rows[r] = []
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]).astype(index_dtype)
    values = None if name == "unweighted" else rng.uniform(-1, 1, indices.shape[0])
    return indptr, indices, values, num_rows, num_cols


def dense_reference(indptr, indices, values, num_rows, num_cols) -> torch.Tensor:
    """The matrix as a dense float64 tensor (duplicates add)."""
    D = torch.zeros(num_rows, num_cols, dtype=torch.float64)
    rows = torch.repeat_interleave(torch.arange(num_rows), torch.from_numpy(np.diff(indptr)))
    vals = torch.ones(len(indices), dtype=torch.float64)
    if values is not None:
        vals = torch.from_numpy(np.asarray(values, dtype=np.float32)).double()
    D.index_put_((rows, torch.from_numpy(indices.astype(np.int64))), vals, accumulate=True)
    return D


def check_parity(
    A: CSRMatrix, D: torch.Tensor, X: torch.Tensor, G: torch.Tensor, scale: float = 1.0
) -> None:
    """Forward and gradient of ``spmm(A, X)`` with upstream gradient ``G`` against ``D``.

    ``scale`` widens the tolerances (float32 sums of very long rows round more).
    """
    atol, rtol = (t * scale for t in TOLERANCES[X.dtype])
    X = X.detach().requires_grad_(True)
    Y = spmm(A, X)
    assert Y.shape == (A.num_rows, X.shape[1]) and Y.dtype == X.dtype
    torch.testing.assert_close(Y.double(), D @ X.detach().double(), atol=atol, rtol=rtol)
    Y.backward(G)
    assert X.grad.shape == X.shape and X.grad.dtype == X.dtype
    torch.testing.assert_close(X.grad.double(), D.t() @ G.double(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("case", ["random", "unweighted", "empty_rows", "no_nnz", "rectangular"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_spmm_parity(backend, case, width, index_dtype):
    indptr, indices, values, n_rows, n_cols = make_case(case, index_dtype, backend)
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols)
    assert A.indices.dtype == torch.from_numpy(indices).dtype
    D = dense_reference(indptr, indices, values, n_rows, n_cols)
    gen = torch.Generator().manual_seed(width)
    X = torch.randn(n_cols, width, generator=gen)
    G = torch.randn(n_rows, width, generator=gen)
    check_parity(A, D, X, G)


def rounding_bound(D: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Elementwise tolerance for float32 sums ``D @ X`` with long rows, from the rounding model.

    A running float32 sum of ``n`` terms rounds once per term by at most ``u |S_k|`` (``u`` =
    2^-24, ``S_k`` the partial sum); with random signs the partial sums are of size
    ``sqrt(k) sigma`` and the errors add like a random walk, so the total is about
    ``u sqrt(n) sqrt(sum_j (a_j x_j)^2)``. Eight times that, plus the float32 floor, bounds what
    any summation order gives while a term dropped or doubled (size ``|a_j x_j|``) still fails.
    """
    u = 2.0**-24
    n = (D != 0).sum(dim=1, keepdim=True).double().clamp(min=1)
    spread = ((D * D) @ (X.double() ** 2)).sqrt()
    return 8 * u * n.sqrt() * spread + 1e-5


@pytest.mark.parametrize("width", [3, 128])
def test_spmm_hub_row(backend, width):
    indptr, indices, values, n_rows, n_cols = make_case("hub", np.int32, backend)
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols)
    D = dense_reference(indptr, indices, values, n_rows, n_cols)
    if backend == "triton" and width > 3:
        pytest.skip("the interpreter walks the 2000-row transpose one program per row: width 3")
    gen = torch.Generator().manual_seed(width)
    X = torch.randn(n_cols, width, generator=gen).requires_grad_(True)
    G = torch.randn(n_rows, width, generator=gen)
    Y = spmm(A, X)
    err = (Y.double() - D @ X.detach().double()).abs()
    bound = rounding_bound(D, X.detach())
    assert (err <= bound).all(), f"forward error {err.max():.3g} over bound at {err.argmax()}"
    Y.backward(G)
    err = (X.grad.double() - D.t() @ G.double()).abs()
    bound = rounding_bound(D.t(), G)
    assert (err <= bound).all(), f"gradient error {err.max():.3g} over bound"
    # Dropping the hub row's last term moves its output by |a x| >> the bound: the check bites.
    j = int(indices[indptr[1] - 1])
    dropped = D[0] @ X.detach().double() - D[0, j] * X.detach().double()[j]
    assert ((dropped - D[0] @ X.detach().double()).abs() > bound[0]).any()


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_spmm_non_contiguous(backend, layout):
    indptr, indices, values, n_rows, n_cols = make_case("random", np.int64, backend, seed=3)
    A = CSRMatrix(indptr, indices, values)
    D = dense_reference(indptr, indices, values, n_rows, n_cols)
    if layout == "transposed":
        X = torch.randn(17, n_cols).t()
        G = torch.randn(17, n_rows).t()
    else:
        X = torch.randn(n_cols, 34)[:, ::2]
        G = torch.randn(n_rows, 51)[:, ::3]
    assert not X.is_contiguous() and not G.is_contiguous()
    check_parity(A, D, X, G)


@pytest.mark.parametrize("width", [17, 128])
def test_spmm_bfloat16(backend, width):
    indptr, indices, values, n_rows, n_cols = make_case("random", np.int32, backend, seed=5)
    A = CSRMatrix(indptr, indices, values)
    D = dense_reference(indptr, indices, values, n_rows, n_cols)
    X = torch.randn(n_cols, width).bfloat16()
    G = torch.randn(n_rows, width).bfloat16()
    check_parity(A, D, X, G)


def test_backends_agree_on_normalized_gcn_matrix(monkeypatch):
    """The same GCN-normalised matrix with self loops gives the same product everywhere."""
    indptr, indices, _, n, _ = make_case("empty_rows", np.int32, "cpu", seed=9)
    A = CSRMatrix(indptr, indices).with_self_loops()
    deg = A.row_nnz().double()
    A = A.gcn_normalized(deg, deg)
    X = torch.randn(n, 33)
    outs = {}
    for name in BACKENDS:
        use_backend(monkeypatch, name)
        outs[name] = spmm(A, X)
    for name in BACKENDS:
        torch.testing.assert_close(outs[name], outs["torch"], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["torch", "cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_spmm_ordered_reads_split_sources_alike(monkeypatch, name, dtype):
    """``spmm_ordered_`` gives the same bits whether a row's sources lie in ``X`` or in
    ``halo`` (the rank-count-invariant aggregation's contract), writes only ``rows``, and is
    the product to rounding."""
    use_backend(monkeypatch, name)
    rng = np.random.default_rng(7)
    n_rows, n_cols, width = 40, 60, 19
    counts = rng.integers(0, 9, n_rows)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = rng.integers(0, n_cols, indptr[-1])
    values = rng.random(indptr[-1]).astype(np.float32)
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols)
    x = (torch.randn(n_cols, width) * 10 ** torch.empty(n_cols, 1).uniform_(-3, 3)).to(dtype)
    rows = torch.from_numpy(rng.permutation(50)[:n_rows].astype(np.int64))
    whole = spmm_ordered_(torch.full((50, width), -7.0), A, rows, x)
    for cut in (0, 25, n_cols):
        split = spmm_ordered_(torch.full((50, width), -7.0), A, rows, x[:cut], x[cut:])
        assert torch.equal(split, whole), cut
    untouched = torch.ones(50, dtype=torch.bool)
    untouched[rows] = False
    assert bool((whole[untouched] == -7.0).all())
    want = torch.from_numpy(A.to_scipy().astype(np.float64) @ x.double().numpy()).float()
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(whole[rows], want, atol=atol * 1e3, rtol=rtol)


@pytest.mark.parametrize("name", ["torch", "cpu"])
def test_spmm_ordered_bf16_out_is_the_float32_result_rounded(monkeypatch, name):
    """A bfloat16 ``out`` holds the bits of the float32 result's ``.to(torch.bfloat16)``
    (round to nearest even, ties included: values built to land halfway between two bfloat16
    numbers), with split sources alike, and ``rows`` only written."""
    use_backend(monkeypatch, name)
    rng = np.random.default_rng(11)
    n_rows, n_cols, width = 30, 45, 21
    counts = rng.integers(0, 7, n_rows)
    counts[0] = 1  # a row that copies one source: a halfway value stays one
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = rng.integers(0, n_cols, indptr[-1])
    indices[0] = 0
    values = rng.random(indptr[-1]).astype(np.float32)
    values[0] = 1.0 + 2.0**-8  # 1 + 2^-8 times a bfloat16: float32 sums near ties
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols)
    x = (torch.randn(n_cols, width) * 10 ** torch.empty(n_cols, 1).uniform_(-3, 3)).bfloat16()
    x[3, 0], x[4, 1], x[5, 2] = float("inf"), float("-inf"), float("nan")  # specials as torch
    rows = torch.from_numpy(rng.permutation(40)[:n_rows].astype(np.int64))
    wide = spmm_ordered_(torch.zeros(40, width), A, rows, x)
    for cut in (0, 20, n_cols):
        out = torch.full((40, width), -7.0).bfloat16()
        got = spmm_ordered_(out, A, rows, x[:cut], x[cut:])
        assert got.dtype == torch.bfloat16
        want = wide[rows].to(torch.bfloat16).view(torch.int16)  # bit patterns: NaN included
        assert torch.equal(got[rows].view(torch.int16), want), cut
        untouched = torch.ones(40, dtype=torch.bool)
        untouched[rows] = False
        assert bool((got[untouched] == -7.0).all())
