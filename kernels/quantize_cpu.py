"""The numba CPU path of :func:`fullgraph.kernels.quantize` / :func:`~fullgraph.kernels.dequantize`.

Byte-identical to :func:`~fullgraph.kernels.quantize.quantize_torch` and
:func:`~fullgraph.kernels.quantize.dequantize_torch`: the same float32 operations in the same
order (no fused multiply-add: numba compiles without ``fastmath``), and the same 32-bit counter
hash of ``(key, row, column)`` for the stochastic rounding noise, computed in uint64 with explicit
``mod 2^32`` masks. Rows run in parallel over ``numba.prange`` in blocks of :data:`ROW_BLOCK`.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from fullgraph.hashing import lowbias32_u64
from fullgraph.kernels.cpu_launch import numba_launch
from fullgraph.kernels.quantized_rows import QuantizedRows, packed_width, record_nbytes

#: Rows one parallel work item handles (one scratch buffer of codes per block).
ROW_BLOCK = 64

_M32 = np.uint64(0xFFFFFFFF)
_S8 = np.uint64(8)
_INV24 = np.float32(1.0 / (1 << 24))


@njit(inline="always", cache=True)
def _row_codes(row, i, levels, stochastic, ukey, codes):  # pragma: no cover - numba
    """Codes of float32 ``row`` (row ``i`` of its matrix) into ``codes[:f]``; (min, scale)."""
    f = row.shape[0]
    zero = np.float32(0.0)
    mn = row[0]
    mx = row[0]
    for j in range(1, f):
        v = row[j]
        mn = min(mn, v)
        mx = max(mx, v)
    scale = (mx - mn) / levels
    inv = np.float32(1.0) / scale if scale > zero else zero
    if stochastic:
        k1 = lowbias32_u64(np.uint64(i) ^ ukey)
        for j in range(f):
            h = lowbias32_u64((k1 + np.uint64(j)) & _M32)
            u = np.float32(h >> _S8) * _INV24
            v = np.floor((row[j] - mn) * inv + u)
            codes[j] = np.uint8(min(max(v, zero), levels))
    else:
        for j in range(f):
            v = np.floor((row[j] - mn) * inv + np.float32(0.5))
            codes[j] = np.uint8(min(max(v, zero), levels))
    return mn, scale


@njit(inline="always", cache=True)
def _pack_codes(codes, bits, out):  # pragma: no cover - numba
    """Pack ``codes`` (``8 // bits`` per byte, lowest bits first) into the bytes of ``out``."""
    width = out.shape[0]
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


@njit(parallel=True, cache=True)
def _quantize_rows(x, bits, stochastic, key, packed, row_min, row_scale):  # pragma: no cover
    """Quantize float32 ``x`` [n, f] (f >= 1) into ``packed``, ``row_min``, ``row_scale``."""
    n = x.shape[0]
    width = packed.shape[1]
    levels = np.float32((1 << bits) - 1)
    per = 8 // bits
    ukey = np.uint64(key)
    blocks = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(blocks):
        codes = np.zeros(width * per, dtype=np.uint8)  # tail stays 0: the padding bits
        for i in range(blk * ROW_BLOCK, min(n, (blk + 1) * ROW_BLOCK)):
            mn, scale = _row_codes(x[i], i, levels, stochastic, ukey, codes)
            _pack_codes(codes, bits, packed[i])
            row_min[i] = mn
            row_scale[i] = scale


@njit(parallel=True, cache=True)
def _quantize_records(
    x, residual, feedback, bits, stochastic, key, records
):  # pragma: no cover - numba
    """Quantize the rows of ``x`` straight into wire records: per row the packed codes, then
    float32 min and scale as bytes (:meth:`QuantizedRows.to_bytes` layout).

    With ``feedback`` the row quantized is ``v = x + residual`` and ``residual`` becomes
    ``v - dequantized(v)``, in the same pass: the same float32 operations in the same order as
    torch's add, quantize, dequantize and subtract, so bytes and residuals are identical.
    """
    n, f = x.shape
    width = records.shape[1] - 8
    levels = np.float32((1 << bits) - 1)
    per = 8 // bits
    ukey = np.uint64(key)
    blocks = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(blocks):
        codes = np.zeros(width * per, dtype=np.uint8)
        vals = np.empty(f, dtype=np.float32)
        params = np.empty(2, dtype=np.float32)
        param_bytes = params.view(np.uint8)
        for i in range(blk * ROW_BLOCK, min(n, (blk + 1) * ROW_BLOCK)):
            for j in range(f):
                vals[j] = x[i, j] + residual[i, j] if feedback else x[i, j]
            mn, scale = _row_codes(vals, i, levels, stochastic, ukey, codes)
            rec = records[i]
            _pack_codes(codes, bits, rec[:width])
            params[0] = mn
            params[1] = scale
            for b in range(8):
                rec[width + b] = param_bytes[b]
            if feedback:
                for j in range(f):
                    residual[i, j] = vals[j] - (mn + np.float32(codes[j]) * scale)


@njit(inline="always", cache=True)
def _dequantize_row(src, mn, sc, bits, dst):  # pragma: no cover - numba
    """``dst[j] = mn + code_j * sc`` for the codes packed in ``src``."""
    f = dst.shape[0]
    per = 8 // bits
    full = f // per  # bytes whose codes are all real columns
    mask = np.uint8((1 << bits) - 1)
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


@njit(parallel=True, cache=True)
def _dequantize_records(records, bits, out):  # pragma: no cover - numba
    """``out`` [n, f] from wire records (codes, then float32 min and scale as bytes)."""
    n = out.shape[0]
    width = records.shape[1] - 8
    blocks = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for blk in prange(blocks):
        params = np.empty(2, dtype=np.float32)
        param_bytes = params.view(np.uint8)
        for i in range(blk * ROW_BLOCK, min(n, (blk + 1) * ROW_BLOCK)):
            rec = records[i]
            for b in range(8):
                param_bytes[b] = rec[width + b]
            _dequantize_row(rec[:width], params[0], params[1], bits, out[i])


@njit(parallel=True, cache=True)
def _dequantize_rows(packed, row_min, row_scale, bits, out):  # pragma: no cover - numba
    """``out[i, j] = row_min[i] + code[i, j] * row_scale[i]`` in float32."""
    for i in prange(out.shape[0]):
        _dequantize_row(packed[i], row_min[i], row_scale[i], bits, out[i])


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
    with numba_launch(chunksize=None):
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


def encode_records_cpu(
    X: torch.Tensor,
    bits: int,
    stochastic: bool,
    key: int,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantize the rows of ``X`` (plus ``residual``) straight into one wire buffer.

    Args:
        X: float [N, F] on the CPU (read as float32).
        bits, stochastic, key: as :func:`quantize_cpu`.
        residual: error feedback: float32 contiguous [N, F], added before quantizing and left
            holding the new quantization error (in place); ``None`` for none.

    Returns:
        uint8 [N * record_nbytes(F, bits)], equal to ``quantize_torch(...).to_bytes()``.
    """
    n, f = X.shape
    records = torch.empty((n, record_nbytes(f, bits)), dtype=torch.uint8)  # every byte written
    if n == 0 or f == 0:
        return records.view(-1)
    feedback = residual is not None
    with numba_launch(chunksize=None):
        _quantize_records(
            X.detach().to(torch.float32).contiguous().numpy(),
            residual.numpy() if feedback else np.zeros((1, 1), np.float32),
            feedback,
            bits,
            bool(stochastic),
            int(key),
            records.numpy(),
        )
    return records.view(-1)


def decode_records_cpu(buf: torch.Tensor, n: int, f: int, bits: int) -> torch.Tensor:
    """Float32 [n, f] rows of an :func:`encode_records_cpu` (or ``to_bytes``) buffer."""
    out = torch.empty((n, f), dtype=torch.float32)
    if n == 0 or f == 0:
        return out
    with numba_launch(chunksize=None):
        _dequantize_records(buf.reshape(n, record_nbytes(f, bits)).numpy(), bits, out.numpy())
    return out


def dequantize_cpu(q: QuantizedRows) -> torch.Tensor:
    """Float32 [N, F] values of CPU quantized rows, byte-identical to ``dequantize_torch(q)``."""
    n, f = q.num_rows, q.num_cols
    out = torch.empty((n, f), dtype=torch.float32)
    if n == 0 or f == 0:
        return out
    with numba_launch(chunksize=None):
        _dequantize_rows(
            q.packed.contiguous().numpy(),
            q.row_min.to(torch.float32).contiguous().numpy(),
            q.row_scale.to(torch.float32).contiguous().numpy(),
            q.bits,
            out.numpy(),
        )
    return out
