"""The CPU back-end of :func:`~fullgraph.kernels.edge_attention.edge_attention`: numba kernels.

For float32 / float64 CPU tensors. The forward is one pass per row (online softmax: the running
sums are rescaled when a larger score arrives), reading every neighbour row once, with the next
rows prefetched; the backward has a row pass (coefficient gradients, softmax backward,
destination terms) writing two temporary ``E x heads`` buffers that live only during the
backward, and a column pass over the cached transpose (source rows' gradients, no atomics). Row
ranges per thread hold equal numbers of edges. The attention-dropout mask is drawn in the
kernels from the keys of :func:`~fullgraph.kernels.attention_dropout.attention_keys`, the bits
of :func:`~fullgraph.kernels.attention_dropout.attention_keep`.

The source terms sit in the columns after the projected rows (``[xp | a_src . xp]``, the rows a
GAT layer exchanges), so one cache line brings both; the destination terms may follow them.
Measured on an arxiv-sized graph (1.34M edges with self-loops, 4 heads x 64, one thread): forward
0.53 s, backward 1.3 s; the fused online pass was 1.2x faster than a separate maximum pass, and
prefetching 1.25x.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from fullgraph.hashing import splitmix64_u64
from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.cpu_launch import numba_launch
from fullgraph.kernels.spmm_cpu import PREFETCH_DISTANCE, _prefetch_row


@numba.njit(parallel=True, cache=True, nogil=True)
def _forward_rows(
    indptr,
    indices,
    gids,
    xp,
    adst,
    width,
    keys,
    threshold,
    scale,
    slope,
    out,
    rmax,
    rden,
    bounds,
):  # pragma: no cover - JIT
    """out[i] = sum over j in N(i) + {i} of softmax * keep * scale * xp[j]; rmax, rden per row.

    One pass per row (online softmax: when a larger score arrives, the running sums are scaled
    by ``exp(old max - new max)``). Edge ``e = indptr[i] - 1`` of row ``i`` is its self-loop.
    """
    heads = adst.shape[1]
    hc = heads * width
    words = keys.shape[0]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        mx = np.empty(heads, dtype=xp.dtype)
        den = np.empty(heads, dtype=xp.dtype)
        rk = np.empty(max(words, 1), dtype=np.uint64)
        for i in range(bounds[c], bounds[c + 1]):
            start, stop = indptr[i], indptr[i + 1]
            o = out[i]
            for f in range(o.shape[0]):
                o[f] = 0
            for h in range(heads):
                s = xp[i, hc + h] + adst[i, h]
                mx[h] = s if s > 0 else s * slope
                den[h] = 0
            gi = np.uint64(gids[i])
            for w in range(words):
                rk[w] = splitmix64_u64(keys[w] ^ gi)
            for e in range(start - 1, stop):
                if start <= e < last:
                    _prefetch_row(xp, indices[e + PREFETCH_DISTANCE])
                j = i if e < start else indices[e]
                xj = xp[j]
                gj = np.uint64(gids[j])
                z = np.uint64(0)
                for h in range(heads):
                    s = xp[j, hc + h] + adst[i, h]
                    s = s if s > 0 else s * slope
                    base = h * width
                    if s > mx[h]:
                        r = np.exp(mx[h] - s)
                        den[h] *= r
                        for f in range(width):
                            o[base + f] *= r
                        mx[h] = s
                    q = np.exp(s - mx[h])
                    den[h] += q
                    if words > 0:
                        if h % 4 == 0:
                            z = splitmix64_u64(rk[h // 4] ^ gj)
                        lane = (z >> np.uint64(16 * (h % 4))) & np.uint64(0xFFFF)
                        if lane < threshold:
                            continue
                    for f in range(width):
                        o[base + f] += q * xj[base + f]
            for h in range(heads):
                rmax[i, h] = mx[h]
                rden[i, h] = den[h]
                inv = scale / den[h]
                base = h * width
                for f in range(width):
                    o[base + f] *= inv


@numba.njit(parallel=True, cache=True, nogil=True)
def _backward_rows(
    indptr,
    indices,
    gids,
    xp,
    adst,
    width,
    rmax,
    rden,
    grad,
    keys,
    threshold,
    scale,
    slope,
    zero,
    coef,
    dscore,
    coef_self,
    dscore_self,
    grad_adst,
    bounds,
):  # pragma: no cover - JIT
    """Per edge: coef = alpha * keep * scale and dscore = d loss / d (a_src[j] + a_dst[i]);
    per row: grad_adst[i] = sum of its edges' dscore. Self-loops go to the ``*_self`` arrays."""
    heads = adst.shape[1]
    hc = heads * width
    words = keys.shape[0]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        dot_sum = np.empty(heads, dtype=xp.dtype)
        rk = np.empty(max(words, 1), dtype=np.uint64)
        for i in range(bounds[c], bounds[c + 1]):
            start, stop = indptr[i], indptr[i + 1]
            gi = np.uint64(gids[i])
            for w in range(words):
                rk[w] = splitmix64_u64(keys[w] ^ gi)
            go = grad[i]
            for h in range(heads):
                dot_sum[h] = 0
            for e in range(start - 1, stop):  # coefficients and their gradients
                if start <= e < last:
                    _prefetch_row(xp, indices[e + PREFETCH_DISTANCE])
                j = i if e < start else indices[e]
                xj = xp[j]
                gj = np.uint64(gids[j])
                z = np.uint64(0)
                for h in range(heads):
                    pre = xp[j, hc + h] + adst[i, h]
                    s = pre if pre > 0 else pre * slope
                    alpha = np.exp(s - rmax[i, h]) / rden[i, h]
                    k = scale
                    if words > 0:
                        if h % 4 == 0:
                            z = splitmix64_u64(rk[h // 4] ^ gj)
                        lane = (z >> np.uint64(16 * (h % 4))) & np.uint64(0xFFFF)
                        if lane < threshold:
                            k = zero
                    d = zero
                    if k != 0:
                        base = h * width
                        for f in range(width):
                            d += go[base + f] * xj[base + f]
                        d *= k
                    ad = alpha * d
                    dot_sum[h] += ad
                    if e < start:
                        coef_self[i, h] = alpha * k
                        dscore_self[i, h] = ad
                    else:
                        coef[e, h] = alpha * k
                        dscore[e, h] = ad
            ga = grad_adst[i]
            for h in range(heads):
                ga[h] = 0
            for e in range(start - 1, stop):  # softmax and LeakyReLU backward
                j = i if e < start else indices[e]
                for h in range(heads):
                    pre = xp[j, hc + h] + adst[i, h]
                    s = pre if pre > 0 else pre * slope
                    alpha = np.exp(s - rmax[i, h]) / rden[i, h]
                    if e < start:
                        v = dscore_self[i, h] - alpha * dot_sum[h]
                    else:
                        v = dscore[e, h] - alpha * dot_sum[h]
                    if not pre > 0:
                        v *= slope
                    if e < start:
                        dscore_self[i, h] = v
                    else:
                        dscore[e, h] = v
                    ga[h] += v


@numba.njit(parallel=True, cache=True, nogil=True)
def _backward_columns(
    t_indptr,
    t_rows,
    t_edge,
    num_inner,
    grad,
    heads,
    width,
    coef,
    dscore,
    coef_self,
    dscore_self,
    grad_xp,
    bounds,
):  # pragma: no cover - JIT
    """grad_xp[j, :hc] = sum over out-edges (and the self-loop) of coef * grad[i];
    grad_xp[j, hc:hc + heads] = sum of their dscore; further columns 0."""
    hc = heads * width
    last = t_rows.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        for j in range(bounds[c], bounds[c + 1]):
            gx = grad_xp[j]
            for f in range(gx.shape[0]):
                gx[f] = 0
            ga = gx[hc : hc + heads]
            if j < num_inner:
                gj = grad[j]
                for h in range(heads):
                    ga[h] += dscore_self[j, h]
                    cf = coef_self[j, h]
                    if cf != 0:
                        base = h * width
                        for f in range(width):
                            gx[base + f] += cf * gj[base + f]
            for t in range(t_indptr[j], t_indptr[j + 1]):
                if t < last:
                    _prefetch_row(grad, t_rows[t + PREFETCH_DISTANCE])
                i = t_rows[t]
                e = t_edge[t]
                gi = grad[i]
                for h in range(heads):
                    ga[h] += dscore[e, h]
                    cf = coef[e, h]
                    if cf != 0:
                        base = h * width
                        for f in range(width):
                            gx[base + f] += cf * gi[base + f]


def _drop_args(
    keys: np.ndarray | None, p: float, dtype: torch.dtype
) -> tuple[np.ndarray, Any, Any]:
    """(keys, threshold, scale) for the numba kernels: no words when nothing is dropped."""
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    if keys is None or p <= 0:
        return np.empty(0, np.uint64), np.uint64(0), np_dtype(1.0)
    return np.ascontiguousarray(keys, np.uint64), np.uint64(round(p * 65536)), np_dtype(1 / (1 - p))


def attention_forward_numba(
    g: AttentionGraph,
    rows: torch.Tensor,
    adst: torch.Tensor,
    width: int,
    keys: np.ndarray | None,
    p: float,
    slope: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, rmax, rden) with the numba kernel (CPU tensors, no autograd)."""
    np_dtype = np.float64 if rows.dtype == torch.float64 else np.float32
    words, threshold, scale = _drop_args(keys, p, rows.dtype)
    heads = adst.shape[1]
    out = torch.empty((g.num_inner, heads * width), dtype=rows.dtype)
    rmax = torch.empty((g.num_inner, heads), dtype=rows.dtype)
    rden = torch.empty((g.num_inner, heads), dtype=rows.dtype)
    with numba_launch() as threads:
        _forward_rows(
            g.indptr_np(),
            g.indices_np(),
            g.global_ids,
            rows.numpy(),
            adst.numpy(),
            width,
            words,
            threshold,
            scale,
            np_dtype(slope),
            out.numpy(),
            rmax.numpy(),
            rden.numpy(),
            g.row_ranges(threads),
        )
    return out, rmax, rden


def attention_backward_numba(
    g: AttentionGraph,
    rows: torch.Tensor,
    adst: torch.Tensor,
    width: int,
    rmax: torch.Tensor,
    rden: torch.Tensor,
    grad: torch.Tensor,
    keys: np.ndarray | None,
    p: float,
    slope: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_rows, grad_adst) with the numba kernels (CPU tensors, no autograd)."""
    np_dtype = np.float64 if rows.dtype == torch.float64 else np.float32
    words, threshold, scale = _drop_args(keys, p, rows.dtype)
    heads = adst.shape[1]
    coef = np.empty((g.num_edges, heads), dtype=np_dtype)
    dscore = np.empty((g.num_edges, heads), dtype=np_dtype)
    coef_self = np.empty((g.num_inner, heads), dtype=np_dtype)
    dscore_self = np.empty((g.num_inner, heads), dtype=np_dtype)
    grad_adst = torch.empty((g.num_inner, heads), dtype=rows.dtype)
    grad_rows = torch.empty_like(rows)  # every row zeroed by the column pass
    t_indptr, t_rows, t_edge = g.transpose()
    with numba_launch() as threads:
        _backward_rows(
            g.indptr_np(),
            g.indices_np(),
            g.global_ids,
            rows.numpy(),
            adst.numpy(),
            width,
            rmax.numpy(),
            rden.numpy(),
            grad.numpy(),
            words,
            threshold,
            scale,
            np_dtype(slope),
            np_dtype(0),
            coef,
            dscore,
            coef_self,
            dscore_self,
            grad_adst.numpy(),
            g.row_ranges(threads),
        )
        del rows
        _backward_columns(
            t_indptr,
            t_rows,
            t_edge,
            g.num_inner,
            grad.numpy(),
            heads,
            width,
            coef,
            dscore,
            coef_self,
            dscore_self,
            grad_rows.numpy(),
            g.column_ranges(threads),
        )
    return grad_rows, grad_adst
