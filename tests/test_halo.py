"""SplitOperator.add_halo_product: the halo product added a block of rows at a time."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fullgraph.halo as halo_mod
from fullgraph.halo import SplitOperator
from fullgraph.kernels import CSRMatrix, spmm


def _csr(rows: int, cols: int, density: float, seed: int) -> CSRMatrix:
    m = sp.random(rows, cols, density=density, format="csr", random_state=seed, dtype=np.float32)
    m.sort_indices()
    return CSRMatrix(m.indptr, m.indices, m.data, num_cols=cols)


@pytest.mark.parametrize("block_elements", [1, 7 * 5, 10_000_000])
def test_blocked_halo_product_equals_one_product(monkeypatch, block_elements):
    monkeypatch.setattr(halo_mod, "HALO_BLOCK_ELEMENTS", block_elements)
    inner, halo = _csr(50, 50, 0.1, 0), _csr(50, 23, 0.05, 1)  # some rows without halo
    op = SplitOperator(inner, halo)
    h, h_halo = torch.randn(50, 5), torch.randn(23, 5)
    y = spmm(inner, h)
    expected = y + spmm(halo, h_halo)
    out = op.add_halo_product(y, h_halo)
    assert out is y and torch.equal(out, expected)
    assert op.add_halo_product(torch.zeros(50, 9), torch.randn(23, 9)).shape == (50, 9)


def test_no_halo_leaves_the_product_alone():
    inner = _csr(8, 8, 0.3, 2)
    y = torch.randn(8, 4)
    assert torch.equal(SplitOperator(inner, None).add_halo_product(y.clone(), torch.zeros(0, 4)), y)
