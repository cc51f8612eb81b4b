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


#: Row counts below which ``torch.mm``'s rows may differ from the same rows in a taller
#: product (measured on this CPU: 1-3 rows at every width; for one output column most counts
#: and offsets differ, a GEMV path).
SHORT_ROWS = 16


@numba.njit(cache=True, nogil=True, parallel=True)
def _x_wt(x, w, out):  # pragma: no cover - compiled by numba
    """out[i, j] = sum_k x[i, k] * w[j, k], k ascending, in out's dtype; rows in parallel
    (each row's sums alone: the same bits at any thread count)."""
    m, k_cols = x.shape
    n = w.shape[0]
    for i in numba.prange(m):
        for j in range(n):
            acc = out.dtype.type(0.0)
            for k in range(k_cols):
                acc += x[i, k] * w[j, k]
            out[i, j] = acc


def row_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x W^T`` whose every row is a fixed function of that row alone (its bits do not
    depend on how many rows are multiplied at once, nor where they start): narrow outputs
    (fewer than :data:`NARROW_ROWS` columns) of float32 on the CPU go through an ordered loop;
    the rest through ``torch.mm``, a short input (fewer than :data:`SHORT_ROWS` rows) padded
    with zero rows to that many first (taller products were row-invariant in our
    measurements, 1-3 rows were not).

    Args:
        x: [M, K] float32 / float64 / bfloat16.
        weight: [N, K], converted to ``x``'s dtype.
    """
    weight = weight.to(x.dtype)
    m = int(x.shape[0])
    cpu_float = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
    if weight.shape[0] < NARROW_ROWS and cpu_float:
        out = torch.empty((m, weight.shape[0]), dtype=x.dtype)
        xs = np.ascontiguousarray(x.detach().numpy())
        _x_wt(xs, np.ascontiguousarray(weight.detach().numpy()), out.numpy())
        return out
    if m < SHORT_ROWS:
        padded = x.new_zeros((SHORT_ROWS, x.shape[1]))
        padded[:m] = x
        return torch.mm(padded, weight.t())[:m]
    return torch.mm(x, weight.t())
