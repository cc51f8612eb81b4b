"""Dropout whose mask is a function of (seed, epoch, layer, global node id, column).

A counter-based generator (splitmix64) replaces the stateful RNG, so that a node's mask is the
same whichever rank owns it and however many ranks there are: P ranks draw exactly the masks one
process draws. Each 64-bit hash gives four 16-bit uniforms, so the drop probability is ``p``
rounded to a multiple of 1/65536 (exact for 0.5, 0.25, ...).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from fullgraph.hashing import as_int64, key_chain, splitmix64_torch, splitmix64_u64


def stream_key(seed: int, epoch: int, layer: int) -> int:
    """The 64-bit key of one (seed, epoch, layer) stream."""
    return key_chain(seed, epoch, layer)


@numba.njit(inline="always", cache=True, nogil=True)
def _mix_word(counter, key):  # pragma: no cover - JIT
    """splitmix64 of ``counter ^ key``: the 64-bit word holding four 16-bit mask lanes."""
    return splitmix64_u64(counter ^ key)


@numba.njit(parallel=True, cache=True, nogil=True)
def _keep_scale(gids, width, key, threshold, scale, out):  # pragma: no cover - JIT
    """out[i, j] = scale if lane j of node gids[i] survives else 0 (see dropout_keep_mask)."""
    words = (width + 3) // 4
    w64 = np.uint64(words)
    for i in numba.prange(gids.shape[0]):
        base = np.uint64(gids[i]) * w64
        for w in range(words):
            z = _mix_word(base + np.uint64(w), key)
            for k in range(4):
                j = 4 * w + k
                if j < width:
                    lane = (z >> np.uint64(16 * k)) & np.uint64(0xFFFF)
                    out[i, j] = scale if lane >= threshold else np.float32(0.0)


@numba.njit(parallel=True, cache=True, nogil=True)
def _keep_entries(
    indptr, indices, values, gids, width, key, threshold, scale, out
):  # pragma: no cover - JIT
    """out[e] = values[e] * (scale or 0) for the CSR entries: the dense mask at their columns."""
    w64 = np.uint64((width + 3) // 4)
    for r in numba.prange(indptr.shape[0] - 1):
        base = np.uint64(gids[r]) * w64
        for e in range(indptr[r], indptr[r + 1]):
            j = indices[e]
            z = _mix_word(base + np.uint64(j // 4), key)
            lane = (z >> np.uint64(16 * (j % 4))) & np.uint64(0xFFFF)
            out[e] = values[e] * scale if lane >= threshold else np.float32(0.0)


def dropout_csr_values(
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    global_ids: np.ndarray,
    width: int,
    p: float,
    seed: int,
    epoch: int,
    layer: int,
) -> np.ndarray:
    """Values of a sparse feature matrix after :func:`hashed_dropout` (same masks as dense).

    Args:
        indptr, indices, values: CSR of the features (rows = nodes, columns = features).
        global_ids: global node id of every row, int64 [n].
        width: number of feature columns.
        p: drop probability in ``(0, 1)``.
        seed, epoch, layer: the stream the mask is drawn from.

    Returns:
        float32 [nnz]: ``values * mask / (1 - p)`` at the stored entries.
    """
    out = np.empty(values.shape[0], dtype=np.float32)
    key = np.uint64(stream_key(seed, epoch, layer))
    _keep_entries(
        np.ascontiguousarray(indptr, dtype=np.int64),
        np.ascontiguousarray(indices, dtype=np.int64),
        np.ascontiguousarray(values, dtype=np.float32),
        np.ascontiguousarray(global_ids, dtype=np.int64),
        width,
        key,
        np.uint64(round(p * 65536)),
        np.float32(1.0 / (1.0 - p)),
        out,
    )
    return out


def dropout_keep_mask(
    global_ids: np.ndarray, width: int, p: float, seed: int, epoch: int, layer: int
) -> np.ndarray:
    """Boolean keep-mask of ``len(global_ids)`` rows of ``width`` columns.

    Entry ``(i, j)`` is lane ``j % 4`` (16 bits) of ``splitmix64((gid_i * ceil(width / 4) +
    j // 4) ^ stream_key(seed, epoch, layer))``, kept when the lane is ``>= round(p * 65536)``.

    Args:
        global_ids: global node id of every row, int64 [n].
        width: number of columns.
        p: drop probability in ``[0, 1)``.
        seed, epoch, layer: the stream the mask is drawn from.

    Returns:
        bool [n, width]; ``True`` keeps the entry.
    """
    return _scaled_mask(global_ids, width, p, seed, epoch, layer, 1.0) > 0


def _scaled_mask(
    global_ids: np.ndarray, width: int, p: float, seed: int, epoch: int, layer: int, scale: float
) -> np.ndarray:
    gids = np.ascontiguousarray(global_ids, dtype=np.int64)
    out = np.empty((gids.shape[0], width), dtype=np.float32)
    key = np.uint64(stream_key(seed, epoch, layer))
    _keep_scale(gids, width, key, np.uint64(round(p * 65536)), np.float32(scale), out)
    return out


def keep_scale_torch(
    global_ids: torch.Tensor, width: int, p: float, key: int, scale: float
) -> torch.Tensor:
    """The mask of :func:`dropout_keep_mask` times ``scale``, in torch int64 ops on any device.

    int64 arithmetic wraps like uint64 (two's complement), so the bits equal the numba
    kernel's; used for tensors that do not live on the CPU.

    Returns:
        float32 [len(global_ids), width] on the device of ``global_ids``.
    """
    words = (width + 3) // 4
    dev = global_ids.device
    w = torch.arange(words, device=dev, dtype=torch.int64)
    z = splitmix64_torch((global_ids.to(torch.int64)[:, None] * words + w[None, :]) ^ as_int64(key))
    lanes = torch.stack([(z >> (16 * k)) & 0xFFFF for k in range(4)], dim=-1)
    lanes = lanes.reshape(len(global_ids), words * 4)[:, :width]
    keep = lanes >= round(p * 65536)
    return keep.to(torch.float32) * scale


@numba.njit(inline="always", cache=True, nogil=True)
def zero_dropped_lanes(
    row: np.ndarray, gid: np.int64, key: np.uint64, threshold: np.uint64
) -> None:  # pragma: no cover - JIT
    """Zero the entries of ``row`` (one node's, float32 [width]) that node ``gid``'s mask drops
    (the lanes of :func:`dropout_keep_mask` below ``threshold``), in place; compiled."""
    width = row.shape[0]
    words = (width + 3) // 4
    base = np.uint64(gid) * np.uint64(words)
    zero = np.float32(0.0)
    for w in range(words):
        z = _mix_word(base + np.uint64(w), key)
        for k in range(4):
            j = 4 * w + k
            if j < width and ((z >> np.uint64(16 * k)) & np.uint64(0xFFFF)) < threshold:
                row[j] = zero


@numba.njit(parallel=True, cache=True, nogil=True)
def _relu_keep(x, gids, key, threshold, scale, out):  # pragma: no cover - JIT
    """out[i, j] = max(x[i, j], 0) * (scale if kept else 0), masks as _keep_scale. Per row:
    the scaled ReLU over the whole row (a loop that vectorises), then the dropped lanes zeroed
    while the row is in cache: the values of one branchy pass in less than half the time.
    ``out`` may be ``x`` (each element is read before it is written)."""
    width = x.shape[1]
    zero = np.float32(0.0)
    for i in numba.prange(x.shape[0]):
        xi = x[i]
        oi = out[i]
        for j in range(width):
            v = xi[j]
            oi[j] = v * scale if v > 0 else zero
        zero_dropped_lanes(oi, gids[i], key, threshold)


@numba.njit(parallel=True, cache=True, nogil=True)
def _scale_where_positive(out, grad, scale, res):  # pragma: no cover - JIT
    """res[i, j] = grad[i, j] * scale where out[i, j] > 0, else 0 (ReluDropout's backward)."""
    for i in numba.prange(out.shape[0]):
        for j in range(out.shape[1]):
            res[i, j] = grad[i, j] * scale if out[i, j] > 0 else np.float32(0.0)


def hashed_dropout(
    h: torch.Tensor, global_ids: np.ndarray, p: float, seed: int, epoch: int, layer: int
) -> torch.Tensor:
    """Inverted dropout of ``h`` with the counter-based mask of :func:`dropout_keep_mask`.

    Args:
        h: activations, float [n, width] (rows ordered as ``global_ids``).
        global_ids: global node id of each row, int64 [n].
        p: drop probability; 0 returns ``h`` unchanged.
        seed, epoch, layer: the stream the mask is drawn from.

    Returns:
        ``h * mask / (1 - p)``, differentiable with respect to ``h``.
    """
    if p <= 0.0:
        return h
    if not 0.0 < p < 1.0:
        raise ValueError(f"dropout probability {p} outside [0, 1)")
    if h.device.type != "cpu":
        gids = torch.as_tensor(np.asarray(global_ids, dtype=np.int64), device=h.device)
        key = stream_key(seed, epoch, layer)
        return h * keep_scale_torch(gids, h.shape[1], p, key, 1.0 / (1.0 - p)).to(h.dtype)
    mask = _scaled_mask(global_ids, h.shape[1], p, seed, epoch, layer, 1.0 / (1.0 - p))
    return h * torch.from_numpy(mask).to(dtype=h.dtype)


class ReluDropout(torch.autograd.Function):
    """``hashed_dropout(relu(x))`` in one pass; the backward needs only the output.

    ``d out / d x`` is ``scale`` where the output is positive and 0 elsewhere, so no mask is
    kept: the output is saved anyway by the next layer's product, so this costs no memory.

    With ``inplace`` the output overwrites ``x`` and the gradient overwrites the incoming one:
    no activation-sized buffer in either pass. Only for an ``x`` no other operation saved and
    an output whose gradient comes from one consumer that made it afresh (the next layer; the
    caller knows, see :class:`~fullgraph.models.gnn.GNN`).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        global_ids: np.ndarray,
        p: float,
        seed: int,
        epoch: int,
        layer: int,
        inplace: bool = False,
    ) -> torch.Tensor:
        """``relu(x) * mask / (1 - p)`` with the mask of :func:`dropout_keep_mask`."""
        scale = 1.0 / (1.0 - p)
        key = stream_key(seed, epoch, layer)
        inplace = inplace and x.is_contiguous()
        if x.device.type == "cpu" and x.dtype == torch.float32:
            xc = x.detach() if inplace else x.detach().contiguous()
            out = xc if inplace else torch.empty_like(xc)
            gids = np.ascontiguousarray(global_ids, dtype=np.int64)
            threshold = np.uint64(round(p * 65536))
            _relu_keep(xc.numpy(), gids, np.uint64(key), threshold, np.float32(scale), out.numpy())
            if inplace:
                ctx.mark_dirty(x)
                out = x
        else:
            gids = torch.as_tensor(np.asarray(global_ids, dtype=np.int64), device=x.device)
            mask = keep_scale_torch(gids, x.shape[1], p, key, scale).to(x.dtype)
            if inplace:
                ctx.mark_dirty(x)
                out = x.relu_().mul_(mask)
            else:
                out = torch.relu(x) * mask
        ctx.scale, ctx.inplace = scale, inplace
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        """``grad * scale`` where the output is positive, else 0 (one pass, one buffer or
        none)."""
        (out,) = ctx.saved_tensors
        inplace = ctx.inplace and grad.is_contiguous()
        if grad.device.type == "cpu" and grad.dtype == torch.float32 and out.dim() == 2:
            grad = grad if inplace else grad.contiguous()
            res = grad if inplace else torch.empty_like(grad)
            _scale_where_positive(out.numpy(), grad.numpy(), np.float32(ctx.scale), res.numpy())
        elif inplace:
            res = grad.mul_(ctx.scale).masked_fill_(out <= 0, 0.0)
        else:
            res = (grad * ctx.scale).masked_fill_(out <= 0, 0.0)
        return res, None, None, None, None, None, None
