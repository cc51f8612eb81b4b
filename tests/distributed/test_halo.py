"""SplitOperator.add_halo_product: the halo product added into the inner product in place."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fullgraph.distributed.halo import SplitOperator
from fullgraph.kernels import CSRMatrix, spmm

spmm_mod = importlib.import_module(
    "fullgraph.kernels.spmm"
)  # the package exports a function of that name


def _csr(rows: int, cols: int, density: float, seed: int) -> CSRMatrix:
    m = sp.random(rows, cols, density=density, format="csr", random_state=seed, dtype=np.float32)
    m.sort_indices()
    return CSRMatrix(m.indptr, m.indices, m.data, num_cols=cols)


@pytest.mark.parametrize(
    ("kernel", "block_elements"),
    [("torch", 1), ("torch", 7 * 5), ("torch", 10_000_000), ("cpu", 0)],
)
def test_halo_product_added_in_place_equals_one_product(monkeypatch, kernel, block_elements):
    """Off the numba kernel the product goes in row blocks (exactly the blocks' products); the
    numba kernel adds into ``y`` itself (the same sum in another order)."""
    monkeypatch.setenv("FULLGRAPH_KERNEL", kernel)
    monkeypatch.setattr(spmm_mod, "ADD_BLOCK_ELEMENTS", block_elements)
    inner, halo = _csr(50, 50, 0.1, 0), _csr(50, 23, 0.05, 1)  # some rows without halo
    op = SplitOperator(inner, halo)
    h, h_halo = torch.randn(50, 5), torch.randn(23, 5)
    y = spmm(inner, h)
    expected = y + spmm(halo, h_halo)
    out = op.add_halo_product(y, h_halo)
    assert out is y
    if kernel == "torch":
        assert torch.equal(out, expected)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    assert op.add_halo_product(torch.zeros(50, 9), torch.randn(23, 9)).shape == (50, 9)


def test_no_halo_leaves_the_product_alone():
    inner = _csr(8, 8, 0.3, 2)
    y = torch.randn(8, 4)
    assert torch.equal(SplitOperator(inner, None).add_halo_product(y.clone(), torch.zeros(0, 4)), y)


@pytest.mark.parametrize("slices", [1, 3, 8])
def test_exchange_slices_cover_every_row_once_in_peer_order(slices):
    from fullgraph.distributed.exchange_slices import exchange_slices

    send_counts, recv_counts = [4, 0, 7], [5, 2, 0]
    send_index = torch.arange(100, 111)
    pieces = exchange_slices(send_index, send_counts, recv_counts, slices)
    assert [p.index for p in pieces] == list(range(slices))
    # per peer, the slices' counts add up and the rows come in order
    assert [sum(p.send_counts[q] for p in pieces) for q in range(3)] == send_counts
    assert [sum(p.recv_counts[q] for p in pieces) for q in range(3)] == recv_counts
    sent = torch.cat([p.send_index for p in pieces])
    assert sorted(sent.tolist()) == send_index.tolist()
    halo = torch.cat([p.halo_rows for p in pieces])
    assert sorted(halo.tolist()) == list(range(7))
    for p in pieces:
        assert p.halo_rows.tolist() == sorted(p.halo_rows.tolist())
        assert sum(p.send_counts) == p.send_index.numel()


def test_slice_count_bounds_the_buffer():
    from fullgraph.distributed.exchange_slices import slice_count

    assert slice_count(1000, 256, 16 << 20) == 1
    assert slice_count(100_000, 256, 16 << 20) == 7  # 102.4 MB in 16 MiB buffers
    assert slice_count(3, 256, 1) == 3  # never more slices than rows
    assert slice_count(0, 256, 1) == 1


@pytest.mark.parametrize("kernel", ["cpu", "torch"])
def test_sliced_halo_products_add_up_to_the_whole(monkeypatch, kernel):
    """Each slice adds the rows its columns reach (kept compact) into the right output rows."""
    from fullgraph.distributed.exchange_slices import exchange_slices

    monkeypatch.setenv("FULLGRAPH_KERNEL", kernel)

    inner, halo = _csr(30, 30, 0.1, 4), _csr(30, 12, 0.2, 5)
    op = SplitOperator(inner, halo)
    h_halo = torch.randn(12, 6)
    whole = op.add_halo_product(torch.zeros(30, 6), h_halo)
    pieces = exchange_slices(torch.arange(0), [0, 0], [5, 7], 4)
    parts = torch.zeros(30, 6)
    for p in pieces:
        op.add_halo_product(parts, h_halo[p.halo_rows], p)
        np.testing.assert_array_equal(
            op.halo_transpose(p).to_scipy().toarray(),
            halo.to_scipy().toarray()[:, p.halo_rows.numpy()].T,
        )
    torch.testing.assert_close(parts, whole, rtol=1e-6, atol=1e-6)
