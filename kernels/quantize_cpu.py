"""The numba CPU path of :func:`fullgraph.kernels.quantize` / :func:`~fullgraph.kernels.dequantize`.

Byte-identical to :func:`~fullgraph.kernels.quantize.quantize_torch` and
:func:`~fullgraph.kernels.quantize.dequantize_torch`: the same float32 operations in the same
order (no fused multiply-add: numba compiles without ``fastmath``), and the same 32-bit counter
hash of ``(key, row, column)`` for the stochastic rounding noise, computed in uint64 with explicit
``mod 2^32`` masks. Rows run in parallel over ``numba.prange`` in blocks of :data:`ROW_BLOCK`.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from fullgraph.kernels.quantize import QuantizedRows, packed_width
from fullgraph.kernels.spmm_cpu import thread_count

#: Rows one parallel work item handles (one scratch buffer of codes per block).
ROW_BLOCK = 64

_M32 = np.uint64(0xFFFFFFFF)
_S8 = np.uint64(8)
_S15 = np.uint64(15)
_S16 = np.uint64(16)
_C1 = np.uint64(0x7FEB352D)
_C2 = np.uint64(0x846CA68B)
_INV24 = np.float32(1.0 / (1 << 24))


@njit(inline="always", cache=True)
def _mix32(x):  # pragma: no cover - compiled by numba
    """lowbias32 of a uint64 holding a value in [0, 2^32); same as the torch ``_mix32``."""
    x = x ^ (x >> _S16)
    x = (x * _C1) & _M32
    x = x ^ (x >> _S15)
    x = (x * _C2) & _M32
    return x ^ (x >> _S16)


@njit(parallel=True, cache=True)
def _quantize_rows(x, bits, stochastic, key, packed, row_min, row_scale):  # pragma: no cover
    """Quantize float32 ``x`` [n, f] (f >= 1) into ``packed``, ``row_min``, ``row_scale``."""
    n, f = x.shape
    width = packed.shape[1]
    levels = np.float32((1 << bits) - 1)
    per = 8 // bits
    ukey = np.uint64(key)
    zero = np.float32(0.0)
    half = np.float32(0.5)
    blocks = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(blocks):
        codes = np.zeros(width * per, dtype=np.uint8)  # tail stays 0: the padding bits
        for i in range(blk * ROW_BLOCK, min(n, (blk + 1) * ROW_BLOCK)):
            row = x[i]
            mn = row[0]
            mx = row[0]
            for j in range(1, f):
                v = row[j]
                mn = min(mn, v)
                mx = max(mx, v)
            scale = (mx - mn) / levels
            inv = np.float32(1.0) / scale if scale > zero else zero
            if stochastic:
                k1 = _mix32(np.uint64(i) ^ ukey)
                for j in range(f):
                    h = _mix32((k1 + np.uint64(j)) & _M32)
                    u = np.float32(h >> _S8) * _INV24
                    v = np.floor((row[j] - mn) * inv + u)
                    v = min(max(v, zero), levels)
                    codes[j] = np.uint8(v)
            else:
                for j in range(f):
                    v = np.floor((row[j] - mn) * inv + half)
                    v = min(max(v, zero), levels)
                    codes[j] = np.uint8(v)
            out = packed[i]
            if bits == 8:
                for b in range(width):
                    out[b] = codes[b]
            elif bits == 4:
                for b in range(width):
                    out[b] = codes[2 * b] | (codes[2 * b + 1] << np.uint8(4))
            else:
                for b in range(width):
                    out[b] = (
                        codes[4 * b]
                        | (codes[4 * b + 1] << np.uint8(2))
                        | (codes[4 * b + 2] << np.uint8(4))
                        | (codes[4 * b + 3] << np.uint8(6))
                    )
            row_min[i] = mn
            row_scale[i] = scale


@njit(parallel=True, cache=True)
def _dequantize_rows(packed, row_min, row_scale, bits, out):  # pragma: no cover - numba
    """``out[i, j] = row_min[i] + code[i, j] * row_scale[i]`` in float32."""
    n, f = out.shape
    per = 8 // bits
    full = f // per  # bytes whose codes are all real columns
    mask = np.uint8((1 << bits) - 1)
    for i in prange(n):
        mn = row_min[i]
        sc = row_scale[i]
        src = packed[i]
        dst = out[i]
        if bits == 8:
            for j in range(f):
                dst[j] = mn + np.float32(src[j]) * sc
        elif bits == 4:
            for b in range(full):
                c = src[b]
                dst[2 * b] = mn + np.float32(c & mask) * sc
                dst[2 * b + 1] = mn + np.float32(c >> np.uint8(4)) * sc
        else:
            for b in range(full):
                c = src[b]
                dst[4 * b] = mn + np.float32(c & mask) * sc
                dst[4 * b + 1] = mn + np.float32((c >> np.uint8(2)) & mask) * sc
                dst[4 * b + 2] = mn + np.float32((c >> np.uint8(4)) & mask) * sc
                dst[4 * b + 3] = mn + np.float32(c >> np.uint8(6)) * sc
        for j in range(full * per, f):  # the codes of the last, partly padded byte
            c = (src[j // per] >> np.uint8((j % per) * bits)) & mask
            dst[j] = mn + np.float32(c) * sc


def quantize_cpu(X: torch.Tensor, bits: int, stochastic: bool, key: int) -> QuantizedRows:
    """Quantize the rows of CPU tensor ``X`` [N, F] with the numba kernel.

    Args:
        X: floating point [N, F] on the CPU, any strides (read as float32).
        bits: 8, 4 or 2 (checked by the caller).
        stochastic: stochastic (hash noise from ``key``) or round-to-nearest rounding.
        key: the 31-bit key from :func:`~fullgraph.kernels.quantize.seed_key`.

    Returns:
        :class:`QuantizedRows`, byte-identical to ``quantize_torch(X, bits, stochastic, key)``.
    """
    n, f = X.shape
    width = packed_width(f, bits)
    packed = torch.zeros((n, width), dtype=torch.uint8)
    row_min = torch.zeros(n, dtype=torch.float32)
    row_scale = torch.zeros(n, dtype=torch.float32)
    if n == 0 or f == 0:
        return QuantizedRows(packed, row_min, row_scale, bits, f)
    x = X.detach().to(torch.float32).contiguous()
    numba.set_num_threads(thread_count())
    _quantize_rows(
        x.numpy(),
        bits,
        bool(stochastic),
        int(key),
        packed.numpy(),
        row_min.numpy(),
        row_scale.numpy(),
    )
    return QuantizedRows(packed, row_min, row_scale, bits, f)


def dequantize_cpu(q: QuantizedRows) -> torch.Tensor:
    """Float32 [N, F] values of CPU quantized rows, byte-identical to ``dequantize_torch(q)``."""
    n, f = q.num_rows, q.num_cols
    out = torch.empty((n, f), dtype=torch.float32)
    if n == 0 or f == 0:
        return out
    numba.set_num_threads(thread_count())
    _dequantize_rows(
        q.packed.contiguous().numpy(),
        q.row_min.to(torch.float32).contiguous().numpy(),
        q.row_scale.to(torch.float32).contiguous().numpy(),
        q.bits,
        out.numpy(),
    )
    return out
