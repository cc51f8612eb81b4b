"""The backward of :func:`~fullgraph.kernels.edge_attention.edge_attention` in a fixed order
(numba, CPU): the same bits at any rank count (issue 33).

A source row ``j``'s gradient is a sum over its destinations ``i`` (its out-edges and its own
self-loop): ``grad_xp[j] = sum_i coef_ij dOut_i`` and ``grad_asrc[j] = sum_i dscore_ij``. The
kernels here compute every edge's terms from node-level values alone, so that the owner of
``j`` can sum them itself in one fixed order (the self-loop first, then the destinations in
ascending global id), whichever rank holds ``i``:

- :func:`attention_rows_ordered` (on ``i``'s rank, over ``i``'s in-edges in the graph's
  order: the self-loop, then ascending global id of the source): every row's
  ``dot_sum_i = sum_j alpha_ij d_ij`` (``d_ij = keep_ij scale (dOut_i . xp_j)``) and the
  destination terms' gradient ``grad_adst_i = sum_j dscore_ij``;
- :func:`attention_columns_ordered` (on ``j``'s owner): for every destination ``i`` the
  node-level row ``[dOut_i | adst_i | rmax_i | rden_i | dot_sum_i]`` (:func:`destination_rows`;
  a remote ``i``'s row is sent by its rank) gives ``alpha_ij``, ``coef_ij = alpha_ij keep_ij
  scale`` and ``dscore_ij = LeakyReLU'(pre_ij) alpha_ij (d_ij - dot_sum_i)``.

Every term is a function of the same float32 values at every rank count and is added in an
order that does not depend on it: the sums are the same bits. The destinations of ``j`` are the
rows of a :class:`~fullgraph.distributed.ordered.RowSplit` (ascending global id of ``i``,
columns ``< num_inner`` local rows, the others received ones), the transpose the ordered
aggregations use.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from fullgraph.hashing import splitmix64_u64
from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.cpu_launch import numba_launch, row_ranges
from fullgraph.kernels.csr import CSRMatrix
from fullgraph.kernels.edge_attention_cpu import _drop_args
from fullgraph.kernels.spmm_cpu import PREFETCH_DISTANCE, _prefetch_row


@numba.njit(cache=True, nogil=True)
def _word(keys, gi, gj, h):  # pragma: no cover - JIT
    """The 64 mask bits of edge ``j -> i`` for heads ``4 (h // 4) ..`` (the forward's hash)."""
    return splitmix64_u64(splitmix64_u64(keys[h // 4] ^ np.uint64(gi)) ^ np.uint64(gj))


@numba.njit(cache=True, nogil=True)
def _lane_kept(z, h, threshold):  # pragma: no cover - JIT
    """Whether head ``h``'s lane of the mask bits ``z`` keeps the edge."""
    lane = (z >> np.uint64(16 * (h % 4))) & np.uint64(0xFFFF)
    return not lane < threshold


@numba.njit(cache=True, nogil=True)
def _alpha(pre, rmax, rden, slope):  # pragma: no cover - JIT
    """The softmax coefficient of a pre-activation score, given its row's max and sum."""
    s = pre if pre > 0 else pre * slope
    return np.exp(s - rmax) / rden


@numba.njit(cache=True, nogil=True)
def _dot(go, xj, base, width, zero):  # pragma: no cover - JIT
    """``dOut_i[h] . xp_j[h]`` over the head's ``width`` columns from ``base``, in a fixed
    order: four running sums over the columns ``f = 4 q + r`` (independent additions the CPU
    overlaps), added as ``(s0 + s1) + (s2 + s3)``, then the last ``width % 4`` columns."""
    s0 = zero
    s1 = zero
    s2 = zero
    s3 = zero
    stop = base + width - width % 4
    for f in range(base, stop, 4):
        s0 += go[f] * xj[f]
        s1 += go[f + 1] * xj[f + 1]
        s2 += go[f + 2] * xj[f + 2]
        s3 += go[f + 3] * xj[f + 3]
    d = (s0 + s1) + (s2 + s3)
    for f in range(stop, base + width):
        d += go[f] * xj[f]
    return d


@numba.njit(parallel=True, cache=True, nogil=True)
def _rows(
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
    pres,
    alphas,
    ads,
    dot_sum,
    grad_adst,
    bounds,
):  # pragma: no cover - JIT
    """Per inner row ``i``: ``dot_sum[i]`` and ``grad_adst[i]`` over its edges in order (the
    self-loop, then ``indices[indptr[i]:indptr[i + 1]]``); ``pres``, ``alphas`` and ``ads``
    hold every edge's score, ``alpha`` and ``alpha d`` between the two passes (slot
    ``e + i + 1`` of edge ``e``, ``indptr[i] + i`` the self-loop's)."""
    heads = adst.shape[1]
    hc = heads * width
    words = keys.shape[0]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        total = np.empty(heads, dtype=xp.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            start, stop = indptr[i], indptr[i + 1]
            go = grad[i]
            for h in range(heads):
                total[h] = zero
            for e in range(start - 1, stop):
                if start <= e < last:
                    _prefetch_row(xp, indices[e + PREFETCH_DISTANCE])
                j = i if e < start else indices[e]
                xj = xp[j]
                slot = e + i + 1
                z = np.uint64(0)
                for h in range(heads):
                    pre = xj[hc + h] + adst[i, h]
                    alpha = _alpha(pre, rmax[i, h], rden[i, h], slope)
                    if words > 0 and h % 4 == 0:
                        z = _word(keys, gids[i], gids[j], h)
                    d = zero
                    if words == 0 or _lane_kept(z, h, threshold):
                        d = _dot(go, xj, h * width, width, zero) * scale
                    ad = alpha * d
                    pres[slot, h] = pre
                    alphas[slot, h] = alpha
                    ads[slot, h] = ad
                    total[h] += ad
            for h in range(heads):
                dot_sum[i, h] = total[h]
                ga = zero
                for slot in range(start + i, stop + i + 1):
                    v = ads[slot, h] - alphas[slot, h] * total[h]
                    if not pres[slot, h] > 0:
                        v *= slope
                    ga += v
                grad_adst[i, h] = ga


@numba.njit(cache=True, nogil=True)
def _add_edge(
    gx, j, xp, gj, dest, i, gi, heads, width, keys, threshold, scale, slope, zero
):  # pragma: no cover - JIT
    """Add edge ``j -> i``'s terms to source ``j``'s gradient row ``gx``: ``coef dOut_i`` to
    its projection's columns, ``dscore`` to its source terms' (``dest[i]``: ``[dOut_i | adst_i
    | rmax_i | rden_i | dot_sum_i]``)."""
    hc = heads * width
    row = dest[i]
    xj = xp[j]
    words = keys.shape[0]
    z = np.uint64(0)
    for h in range(heads):
        pre = xj[hc + h] + row[hc + h]
        alpha = _alpha(pre, row[hc + heads + h], row[hc + 2 * heads + h], slope)
        if words > 0 and h % 4 == 0:
            z = _word(keys, gi, gj, h)
        k = zero
        d = zero
        if words == 0 or _lane_kept(z, h, threshold):
            k = scale
            d = _dot(row, xj, h * width, width, zero) * scale
        v = alpha * d - alpha * row[hc + 3 * heads + h]
        if not pre > 0:
            v *= slope
        gx[hc + h] += v
        cf = alpha * k
        if cf != 0:
            base = h * width
            for f in range(width):
                gx[base + f] += cf * row[base + f]


@numba.njit(parallel=True, cache=True, nogil=True)
def _columns(
    split_indptr,
    split_indices,
    split_rows,
    gids,
    dest_gids,
    xp,
    dest,
    heads,
    width,
    keys,
    threshold,
    scale,
    slope,
    zero,
    grad_rows,
    bounds,
):  # pragma: no cover - JIT
    """Per source row ``j = split_rows[k]``: its self-loop's terms, then those of the
    destinations ``split_indices[split_indptr[k]:split_indptr[k + 1]]`` in order (a column
    equal to ``j``, a self-loop of the input, is skipped: the attention drops it)."""
    hc = heads * width
    last = split_indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        for k in range(bounds[c], bounds[c + 1]):
            j = split_rows[k]
            gx = grad_rows[j]
            for f in range(hc + heads):
                gx[f] = zero
            gj = gids[j]
            _add_edge(gx, j, xp, gj, dest, j, gj, heads, width, keys, threshold, scale, slope, zero)
            for t in range(split_indptr[k], split_indptr[k + 1]):
                if t < last:
                    _prefetch_row(dest, split_indices[t + PREFETCH_DISTANCE])
                i = split_indices[t]
                if i == j:
                    continue
                _add_edge(
                    gx,
                    j,
                    xp,
                    gj,
                    dest,
                    i,
                    dest_gids[i],
                    heads,
                    width,
                    keys,
                    threshold,
                    scale,
                    slope,
                    zero,
                )


def attention_rows_ordered(
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
    """``(dot_sum, grad_adst)``, both [num_inner, heads], over every inner row's edges in the
    graph's order (CPU tensors; ``rows``: every local node's ``[xp | asrc]``, as the forward
    read them)."""
    np_dtype = np.float64 if rows.dtype == torch.float64 else np.float32
    words, threshold, scale = _drop_args(keys, p, rows.dtype)
    heads = int(adst.shape[1])
    dot_sum = torch.empty((g.num_inner, heads), dtype=rows.dtype)
    grad_adst = torch.empty((g.num_inner, heads), dtype=rows.dtype)
    pres, alphas, ads = (
        np.empty((g.num_edges + g.num_inner, heads), dtype=np_dtype) for _ in range(3)
    )
    with numba_launch() as threads:
        _rows(
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
            pres,
            alphas,
            ads,
            dot_sum.numpy(),
            grad_adst.numpy(),
            g.row_ranges(threads),
        )
    return dot_sum, grad_adst


def destination_rows(
    grad: torch.Tensor,
    adst: torch.Tensor,
    rmax: torch.Tensor,
    rden: torch.Tensor,
    dot_sum: torch.Tensor,
) -> torch.Tensor:
    """What a source's owner needs of destination ``i``: ``[dOut_i | adst_i | rmax_i | rden_i
    | dot_sum_i]``, [num_inner, heads * (width + 4)] (the rows sent to the sources' owners)."""
    return torch.cat([grad, adst, rmax, rden, dot_sum], dim=1).contiguous()


def attention_columns_ordered(
    split_rows: torch.Tensor,
    split: CSRMatrix,
    gids: np.ndarray,
    dest_gids: np.ndarray,
    xp: torch.Tensor,
    dest: torch.Tensor,
    heads: int,
    width: int,
    keys: np.ndarray | None,
    p: float,
    slope: float,
    grad_rows: torch.Tensor,
) -> None:
    """Write columns ``[0, heads * (width + 1))`` of ``grad_rows`` (the projection's and the
    source terms' gradients) of the source rows ``split_rows``, each the sum of its self-loop's
    terms, then its destinations' (``split``'s row ``k`` for source ``split_rows[k]``; a
    column is a row of ``dest``, :func:`destination_rows` of the local rows, then the received
    ones) in their order. CPU tensors; ``xp``: the inner rows' ``[xp | asrc]``; ``gids``: the
    inner rows' global ids, ``dest_gids``: ``dest``'s rows'."""
    if split_rows.numel() == 0:
        return
    np_dtype = np.float64 if xp.dtype == torch.float64 else np.float32
    words, threshold, scale = _drop_args(keys, p, xp.dtype)
    indptr = split.indptr.cpu().numpy().astype(np.int64, copy=False)
    with numba_launch() as threads:
        _columns(
            indptr,
            split.indices.cpu().numpy().astype(np.int64, copy=False),
            split_rows.cpu().numpy(),
            gids,
            dest_gids,
            xp.numpy(),
            dest.numpy(),
            heads,
            width,
            words,
            threshold,
            scale,
            np_dtype(slope),
            np_dtype(0),
            grad_rows.numpy(),
            row_ranges(indptr, threads),
        )
