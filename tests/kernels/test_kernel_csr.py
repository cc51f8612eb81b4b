"""CSRMatrix: construction checks, transpose, self loops, GCN and mean weights, back-end choice.

Enters through :mod:`fullgraph.kernels.csr`.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fullgraph.errors import ConfigError, DataError, FullgraphError
from fullgraph.kernels import CSRMatrix, spmm, spmm_reference
from fullgraph.kernels import backend as backend_mod


def random_csr(rows: int, cols: int, density: float = 0.2, seed: int = 0) -> sp.csr_matrix:
    M = sp.random(rows, cols, density=density, format="csr", random_state=seed, dtype=np.float32)
    M.sort_indices()
    return M


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_transpose_matches_scipy_and_is_cached(index_dtype):
    M = random_csr(13, 31)
    A = CSRMatrix(M.indptr, M.indices.astype(index_dtype), M.data, num_cols=31)
    T = A.t()
    assert T.shape == (31, 13) and T.nnz == A.nnz and T.indices.dtype == A.indices.dtype
    np.testing.assert_array_equal(T.to_scipy().toarray(), M.T.toarray())
    assert A.t() is T and T.t() is A


def test_unweighted_transpose_and_defaults():
    A = CSRMatrix(torch.tensor([0, 2, 3]), torch.tensor([1, 4, 0], dtype=torch.int32))
    assert A.num_rows == 2 and A.num_cols == 5 and A.nnz == 3 and A.values is None
    assert A.t().values is None
    np.testing.assert_array_equal(A.t().to_scipy().toarray(), A.to_scipy().toarray().T)


@pytest.mark.parametrize(
    ("indptr", "indices", "num_cols", "message"),
    [
        ([0, 2, 1], [0, 1], None, "end at nnz"),
        ([0, 2, 1, 2], [0, 1], None, "decreasing"),
        ([1, 2], [0, 1], None, "start at 0"),
        ([0, 2], [0, 5], 3, "column index 5"),
        ([0, 2], [0, -1], None, "negative"),
    ],
)
def test_invalid_csr_raises_one_line_error(indptr, indices, num_cols, message):
    with pytest.raises(DataError, match=message) as info:
        CSRMatrix(np.array(indptr), np.array(indices), num_cols=num_cols)
    assert "\n" not in str(info.value)


def test_float_indices_and_bad_values_are_rejected():
    with pytest.raises(DataError, match="int32 or int64"):
        CSRMatrix(np.array([0, 1]), np.array([0.0]))
    with pytest.raises(DataError, match="values has shape"):
        CSRMatrix(np.array([0, 1]), np.array([0]), values=np.ones(3))


def test_with_self_loops_adds_the_diagonal():
    M = random_csr(6, 9, seed=1)
    A = CSRMatrix(M.indptr, M.indices, M.data, num_cols=9).with_self_loops()
    expected = M.toarray() + np.eye(6, 9, dtype=np.float32)
    np.testing.assert_allclose(A.to_scipy().toarray(), expected)
    assert A.nnz == M.nnz + 6
    with pytest.raises(DataError, match="num_cols"):
        CSRMatrix(M.T.tocsr().indptr, M.T.tocsr().indices, num_cols=6).with_self_loops()


def test_gcn_normalized_matches_pyg_gcn_norm():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    M = random_csr(40, 40, density=0.1, seed=2)
    M = ((M + M.T) > 0).astype(np.float32).tocsr()
    M.setdiag(0)
    M.eliminate_zeros()
    n = 40
    A = CSRMatrix(M.indptr, M.indices.astype(np.int32)).with_self_loops()
    deg = np.diff(M.indptr) + 1.0
    A = A.gcn_normalized(deg, deg)
    coo = M.tocoo()
    # PyG edge_index is (source, target); our row r lists sources c of edges c -> r.
    edge_index = torch.tensor(np.vstack([coo.col, coo.row]), dtype=torch.int64)
    ei, w = gcn_norm(edge_index, num_nodes=n)
    dense_pyg = torch.zeros(n, n).index_put_((ei[1], ei[0]), w, accumulate=True)
    torch.testing.assert_close(torch.from_numpy(A.to_scipy().toarray()), dense_pyg)


def test_gcn_normalized_checks_degree_shapes():
    A = CSRMatrix(np.array([0, 1, 2]), np.array([1, 2]), num_cols=3)
    with pytest.raises(DataError, match="degrees"):
        A.gcn_normalized(np.ones(3), np.ones(3))
    B = A.gcn_normalized(np.array([4.0, 0.0]), np.array([1.0, 1.0, 9.0]))
    torch.testing.assert_close(B.values, torch.tensor([0.5, 0.0]))


def test_mean_normalized_keeps_empty_rows_zero():
    A = CSRMatrix(np.array([0, 3, 3, 4]), np.array([0, 1, 2, 2])).mean_normalized()
    X = torch.arange(6.0).reshape(3, 2)
    expected = torch.tensor([[2.0, 3.0], [0.0, 0.0], [4.0, 5.0]])
    torch.testing.assert_close(spmm(A, X), expected)


def test_to_same_device_is_identity_and_keeps_transpose():
    M = random_csr(5, 5)
    A = CSRMatrix(M.indptr, M.indices, M.data)
    T = A.t()
    assert A.to("cpu") is A and A.to("cpu").t() is T


def test_spmm_shape_and_device_errors():
    A = CSRMatrix(np.array([0, 1]), np.array([0]), num_cols=3)
    with pytest.raises(FullgraphError, match=r"expected \(3, F\)"):
        spmm(A, torch.ones(2, 4))
    with pytest.raises(FullgraphError, match="floating point"):
        spmm(A, torch.ones(3, 4, dtype=torch.int64))


def test_forced_backend_that_cannot_run_raises(monkeypatch):
    A = CSRMatrix(np.array([0, 1]), np.array([0]))
    monkeypatch.setenv("FULLGRAPH_KERNEL", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET"):
        spmm(A, torch.ones(1, 2))
    monkeypatch.setenv("FULLGRAPH_KERNEL", "cuda-please")
    with pytest.raises(ConfigError, match="FULLGRAPH_KERNEL"):
        spmm(A, torch.ones(1, 2))


def test_automatic_choice_falls_back_with_a_warning(monkeypatch):
    monkeypatch.delenv("FULLGRAPH_KERNEL", raising=False)
    real = backend_mod._why_not
    monkeypatch.setattr(
        backend_mod, "_why_not", lambda n, d: "numba is missing" if n == "cpu" else real(n, d)
    )
    M = random_csr(7, 7, seed=4)
    A = CSRMatrix(M.indptr, M.indices, M.data)
    X = torch.randn(7, 5)
    with pytest.warns(RuntimeWarning, match="numba is missing"):
        Y = spmm(A, X)
    torch.testing.assert_close(Y, spmm_reference(A, X))


def test_unknown_cpu_implementation_raises(monkeypatch):
    monkeypatch.setenv("FULLGRAPH_KERNEL", "cpu")
    monkeypatch.setenv("FULLGRAPH_CPU_SPMM", "mkl")
    with pytest.raises(ConfigError, match="FULLGRAPH_CPU_SPMM"):
        spmm(CSRMatrix(np.array([0, 1]), np.array([0])), torch.ones(1, 2))


def test_cpu_kernel_follows_torch_thread_count(monkeypatch):
    monkeypatch.setenv("FULLGRAPH_KERNEL", "cpu")
    monkeypatch.setenv("FULLGRAPH_CPU_SPMM", "numba")
    M = random_csr(30, 30, seed=6)
    A = CSRMatrix(M.indptr, M.indices, M.data)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        spmm(A, torch.randn(30, 4))
        assert numba.get_num_threads() == 1
        torch.set_num_threads(max(before, 2))
        spmm(A, torch.randn(30, 4))
        assert numba.get_num_threads() == min(max(before, 2), numba.config.NUMBA_NUM_THREADS)
    finally:
        torch.set_num_threads(before)


def test_to_torch_sparse_matches_without_warnings(recwarn):
    M = random_csr(8, 11, seed=7)
    A = CSRMatrix(M.indptr, M.indices.astype(np.int32), M.data, num_cols=11)
    np.testing.assert_allclose(A.to_torch_sparse().to_dense().numpy(), M.toarray())
    assert not [w for w in recwarn if "sparse" in str(w.message).lower()]


def test_row_block_shares_storage_and_matches_rows():
    M = random_csr(20, 9, density=0.3, seed=3)
    A = CSRMatrix(M.indptr, M.indices, M.data, num_cols=9)
    B = A.row_block(5, 12)
    assert B.shape == (7, 9) and int(B.indptr[0]) == 0
    np.testing.assert_array_equal(B.to_scipy().toarray(), M[5:12].toarray())
    assert B.indices.data_ptr() == A.indices[int(A.indptr[5]) :].data_ptr()
    assert A.row_block(4, 4).nnz == 0
    with pytest.raises(DataError, match="row block"):
        A.row_block(3, 21)


def test_sorted_by_column_is_stable_and_idempotent():
    # rows with unsorted columns and a duplicate entry (1, 2) whose order must be kept
    A = CSRMatrix(
        torch.tensor([0, 3, 6]),
        torch.tensor([4, 0, 2, 2, 1, 2]),
        torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        num_cols=5,
    )
    S = A.sorted_by_column()
    assert S.indices.tolist() == [0, 2, 4, 1, 2, 2]
    assert S.values.tolist() == [2.0, 3.0, 1.0, 5.0, 4.0, 6.0]
    assert S.sorted_by_column() is S
    np.testing.assert_array_equal(S.to_scipy().toarray(), A.to_scipy().toarray())


def test_select_rows_empties_the_others_and_keeps_shape():
    M = random_csr(9, 14, density=0.4, seed=6)
    A = CSRMatrix(M.indptr, M.indices.astype(np.int32), M.data, num_cols=14)
    keep = torch.tensor([True, False, False, True, True, False, False, False, True])
    S = A.select_rows(keep)
    assert S.shape == (9, 14) and S.indices.dtype == torch.int32
    want = M.toarray() * keep.numpy()[:, None]
    np.testing.assert_array_equal(S.to_scipy().toarray(), want)
    assert A.select_rows(torch.zeros(9, dtype=torch.bool)).nnz == 0
    with pytest.raises(DataError, match="select_rows"):
        A.select_rows(torch.ones(8, dtype=torch.bool))


def test_select_columns_renumbers_and_keeps_row_order():
    M = random_csr(9, 14, density=0.4, seed=5)
    A = CSRMatrix(M.indptr, M.indices.astype(np.int32), M.data, num_cols=14)
    cols = torch.tensor([1, 4, 5, 12])
    S = A.select_columns(cols)
    assert S.shape == (9, 4) and S.indices.dtype == torch.int32
    np.testing.assert_array_equal(S.to_scipy().toarray(), M.toarray()[:, cols.numpy()])
    assert A.select_columns(torch.arange(0)).nnz == 0
