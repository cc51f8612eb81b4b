"""``dY_b^T x_b`` of one node block, the same bits whatever the thread count.

The block tree (:mod:`fullgraph.distributed.tree_sum`) needs each block's weight-gradient
partial to be a fixed function of the block's rows. torch's float32 ``mm`` (MKL) is that for
most shapes, but not for an output of 5-11 rows (and at least 16 columns): there its bits
depend on the thread count (measured: 2 and 8 threads differ from 1, on an AMD EPYC; a GAT
layer's extended weight of 7 rows, a GCN layer with 7 classes). :func:`block_product` takes
such narrow products through a plain numba loop (single-threaded, each output summed over the
rows in order, float32 accumulation as the product's dtype); every other shape, and bfloat16
(oneDNN: invariant in every shape measured), through ``torch.mm``.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

#: Products with fewer output rows than this go through the loop.
NARROW_ROWS = 12


@numba.njit(cache=True, nogil=True)
def _at_b(a, b, out):  # pragma: no cover - compiled by numba
    """out[i, j] = sum_k a[k, i] * b[k, j], k ascending, in out's dtype."""
    k_rows, m = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            out[i, j] = 0.0
        for k in range(k_rows):
            aki = a[k, i]
            row = b[k]
            for j in range(n):
                out[i, j] += aki * row[j]


def block_product(dy_b: torch.Tensor, x_b: torch.Tensor) -> torch.Tensor:
    """``dy_b^T x_b`` ([K, M]^T [K, N] -> [M, N]) in ``dy_b``'s dtype, the same bits at any
    thread count (narrow float products through :func:`_at_b`).

    Args:
        dy_b: [K, M] float32, float64 or bfloat16 (bfloat16: a bfloat16 product, widened to
            float32 by the caller if it wants).
        x_b: [K, N], converted to ``dy_b``'s dtype.
    """
    x_b = x_b.to(dy_b.dtype)
    narrow = dy_b.shape[1] < NARROW_ROWS and dy_b.dtype in (torch.float32, torch.float64)
    if not narrow or dy_b.device.type != "cpu":
        return torch.mm(dy_b.t(), x_b)
    out = torch.empty((dy_b.shape[1], x_b.shape[1]), dtype=dy_b.dtype)
    _at_b(np.ascontiguousarray(dy_b.numpy()), np.ascontiguousarray(x_b.numpy()), out.numpy())
    return out
