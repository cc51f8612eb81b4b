"""``row_product``: ``x W^T`` whose every row is the same bits however many rows are
multiplied at once and wherever they start, for narrow (1-11 columns), wide and short
products; close to ``torch.mm``.

Enters through :mod:`fullgraph.kernels.block_product`.
"""

from __future__ import annotations

import pytest
import torch

from fullgraph.kernels.block_product import row_product


@pytest.mark.parametrize("width,out", [(16, 1), (32, 7), (16, 16), (64, 48)])
def test_rows_are_invariant(width: int, out: int) -> None:
    g = torch.Generator().manual_seed(width + out)
    x = torch.randn(3000, width, generator=g)
    w = torch.randn(out, width, generator=g)
    full = row_product(x, w)
    assert torch.allclose(full, x @ w.t(), rtol=1e-5, atol=1e-5)
    for lo, hi in ((0, 1), (0, 3), (5, 20), (777, 2000), (1, 3000)):
        assert torch.equal(row_product(x[lo:hi].clone(), w), full[lo:hi]), (lo, hi)
