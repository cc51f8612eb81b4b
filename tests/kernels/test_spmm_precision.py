"""bf16-mixed's aggregation kernels: ``spmm(..., out_dtype)`` keeps the float32 / float64 sums of
bfloat16 rows, and ``spmm_exact`` sums every row in float64, so that the order of a row's
entries, and a split of its entries into an inner and a halo part, give the same bits.

Every back-end (Triton through its interpreter) against a float64 reference written here.

Enters through :mod:`fullgraph.kernels.spmm`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_spmm import BACKENDS, dense_reference, make_case, use_backend

from fullgraph.kernels import CSRMatrix, spmm, spmm_add_, spmm_exact


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch) -> str:
    use_backend(monkeypatch, request.param)
    return request.param


def _reference(A: CSRMatrix, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` of the float32 products ``w * x``, summed in float64."""
    rows = A.row_of_entry()
    prods = (A.values[:, None] * X.float().index_select(0, A.indices.long())).double()
    out = torch.zeros((A.num_rows, X.shape[1]), dtype=torch.float64)
    return out.index_add_(0, rows, prods)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [3, 40])
def test_bf16_rows_keep_wide_sums(backend, out_dtype, width) -> None:
    indptr, indices, values, n_rows, n_cols = make_case("random", np.int32, backend, seed=3)
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols)
    X = torch.randn(n_cols, width).bfloat16()
    Y = spmm(A, X, out_dtype)
    assert Y.dtype == out_dtype
    D = dense_reference(indptr, indices, values, n_rows, n_cols)
    torch.testing.assert_close(Y.double(), D @ X.double(), atol=1e-5, rtol=1e-5)
    out = torch.zeros(n_rows, width, dtype=out_dtype)
    spmm_add_(out, A, X)
    torch.testing.assert_close(out.double(), D @ X.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [1, 17, 64])
def test_spmm_exact_ignores_entry_order_and_splits(backend, width) -> None:
    """Rows with shuffled entries, and rows split in two column blocks (the second added to
    the float64 partial sums), give the bits of the whole product."""
    gen = np.random.default_rng(7)
    n_rows, n_cols, deg = 60, 90, 9
    indices = np.stack([gen.choice(n_cols, deg, replace=False) for _ in range(n_rows)])
    values = gen.random((n_rows, deg)).astype(np.float32) * 2 - 0.5
    indptr = torch.arange(0, n_rows * deg + 1, deg)
    X = (torch.randn(n_cols, width) * torch.logspace(-2, 2, width)).bfloat16()

    def csr(idx: np.ndarray, val: np.ndarray, cols: int) -> CSRMatrix:
        lens = torch.tensor([len(r) for r in idx])
        ptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)])
        flat_i = torch.from_numpy(np.concatenate(idx).astype(np.int32))
        return CSRMatrix(ptr, flat_i, torch.from_numpy(np.concatenate(val)), num_cols=cols)

    none = torch.full((n_rows,), -1, dtype=torch.int64)
    empty = torch.empty((0, width), dtype=torch.float64)
    whole = CSRMatrix(
        indptr,
        torch.from_numpy(indices.reshape(-1).astype(np.int32)),
        torch.from_numpy(values.reshape(-1)),
        num_cols=n_cols,
    )
    want = spmm_exact(whole, X, none, empty)
    assert want.dtype == torch.float32
    torch.testing.assert_close(want.double(), _reference(whole, X), atol=1e-6, rtol=1e-6)
    order = [gen.permutation(deg) for _ in range(n_rows)]
    shuffled = csr(
        [indices[r][o] for r, o in enumerate(order)],
        [values[r][o] for r, o in enumerate(order)],
        n_cols,
    )
    assert torch.equal(spmm_exact(shuffled, X, none, empty), want)
    # columns < 45: the "inner" block; the others: the "halo" block, added afterwards
    cut = n_cols // 2
    pairs = list(zip(indices, values, strict=True))
    inner = csr([r[r < cut] for r, _ in pairs], [v[r < cut] for r, v in pairs], cut)
    halo = csr([r[r >= cut] - cut for r, _ in pairs], [v[r >= cut] for r, v in pairs], n_cols - cut)
    rows, compact = halo.without_empty_rows()
    slot = none.clone()
    slot[rows] = torch.arange(rows.numel())
    partial = torch.empty((rows.numel(), width), dtype=torch.float64)
    y = spmm_exact(inner, X[:cut].contiguous(), slot, partial)
    spmm_add_(partial, compact, X[cut:].contiguous())
    y.index_copy_(0, rows, partial.float())
    assert torch.equal(y, want)


@pytest.mark.parametrize("case", ["random", "rectangular", "empty_rows", "unweighted"])
@pytest.mark.parametrize("width", [1, 5, 33])
def test_spmm_exact_is_the_float64_reference_rounded_once(backend, case, width) -> None:
    """Every finished row of ``spmm_exact`` is the float64 reference (:func:`_reference`, its
    sums exact here) rounded once to float32, bit for bit, and every row it leaves in
    ``partial`` is the float64 sum itself; a float32 accumulation would not give those bits."""
    indptr, indices, values, n_rows, n_cols = make_case(case, np.int32, backend, seed=11)
    A = CSRMatrix(indptr, indices, values, num_cols=n_cols)
    weighted = A if A.values is not None else A.with_values(torch.ones(A.nnz))
    X = (torch.randn(n_cols, width, generator=torch.Generator().manual_seed(5)) * 3).bfloat16()
    want = _reference(weighted, X)
    none = torch.full((n_rows,), -1, dtype=torch.int64)
    got = spmm_exact(A, X, none, torch.empty((0, width), dtype=torch.float64))
    assert got.dtype == torch.float32 and torch.equal(got, want.float())
    slot = none.clone()
    slot[1::3] = torch.arange(len(range(1, n_rows, 3)))
    partial = torch.full((int((slot >= 0).sum()), width), torch.nan, dtype=torch.float64)
    rest = spmm_exact(A, X, slot, partial)
    assert torch.equal(partial, want[1::3])
    assert torch.equal(rest[slot < 0], want.float()[slot < 0])
    if case == "random":  # the data tells the two apart: the test sees a float32 sum
        rows = weighted.row_of_entry()
        products = weighted.values[:, None] * X.float().index_select(0, weighted.indices.long())
        single = torch.zeros((n_rows, width)).index_add_(0, rows, products)
        assert width == 1 or not torch.equal(single, want.float())
