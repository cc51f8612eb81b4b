"""Per-row quantization of embeddings for the halo exchange: 8, 4 or 2 bits packed into bytes.

Row ``i`` of ``X`` [N, F] is stored as codes ``q in [0, 2^bits - 1]`` with a float32 minimum and
scale: ``x ~ row_min[i] + q * row_scale[i]``, ``row_scale = (max - min) / (2^bits - 1)``.
Rounding is either deterministic (to nearest: error <= scale / 2) or stochastic (``floor(v + u)``
with ``u`` uniform in [0, 1): unbiased). The uniform numbers come from a counter-based hash of
``(seed, row, column)``, so the CPU path and the Triton path draw the same ones.

Packing (:mod:`fullgraph.kernels.quantized_rows`): a row of F codes at b bits takes
``ceil(F * b / 8)`` bytes; code ``j`` sits in byte ``j // (8 // b)`` at bit
``(j % (8 // b)) * b`` (little end first); padding bits are zero. Bytes on the wire per row:
the packed bytes plus 8 (float32 min and scale), see :meth:`QuantizedRows.to_bytes`, which lays
each row's record out contiguously so that row ranges can be sliced for an all-to-all.
"""

from __future__ import annotations

import torch

from fullgraph.errors import ConfigError, FullgraphError
from fullgraph.hashing import lowbias32
from fullgraph.kernels.backend import select_backend
from fullgraph.kernels.quantized_rows import (
    QuantizedRows,
    check_bits,
    check_records,
    packed_width,
)

_MASK32 = 0xFFFFFFFF


def seed_key(seed: int) -> int:
    """The 31-bit key both paths hash rows with, derived from ``seed``."""
    return int(lowbias32(torch.tensor(seed & _MASK32, dtype=torch.int64))) & 0x7FFFFFFF


def uniform_noise(num_rows: int, num_cols: int, key: int, device: torch.device) -> torch.Tensor:
    """The uniform [0, 1) numbers of stochastic rounding, float32 [num_rows, num_cols]."""
    rows = torch.arange(num_rows, device=device, dtype=torch.int64)
    cols = torch.arange(num_cols, device=device, dtype=torch.int64)
    k1 = lowbias32(rows ^ key)
    h = lowbias32((k1[:, None] + cols[None, :]) & _MASK32)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def quantize_torch(X: torch.Tensor, bits: int, stochastic: bool, key: int) -> QuantizedRows:
    """The plain-torch (CPU) path of :func:`quantize`; see there."""
    n, f = X.shape
    levels = (1 << bits) - 1
    x = X.to(torch.float32)
    if f == 0:
        zeros = torch.zeros(n, dtype=torch.float32, device=X.device)
        return QuantizedRows(
            torch.zeros((n, 0), dtype=torch.uint8, device=X.device), zeros, zeros.clone(), bits, f
        )
    mn = x.amin(dim=1)
    mx = x.amax(dim=1)
    scale = (mx - mn) / levels
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    v = (x - mn[:, None]) * inv[:, None]
    if stochastic:
        v = v + uniform_noise(n, f, key, X.device)
    else:
        v = v + 0.5
    codes = torch.floor(v).clamp_(0, levels).to(torch.uint8)
    per = 8 // bits
    width = packed_width(f, bits)
    padded = torch.zeros((n, width * per), dtype=torch.uint8, device=X.device)
    padded[:, :f] = codes
    shifts = torch.arange(per, device=X.device, dtype=torch.uint8) * bits
    packed = (padded.view(n, width, per) << shifts).sum(dim=2, dtype=torch.int32)
    return QuantizedRows(packed.to(torch.uint8), mn, scale, bits, f)


def dequantize_torch(q: QuantizedRows) -> torch.Tensor:
    """The plain-torch (CPU) path of :func:`dequantize`; see there."""
    n, f, bits = q.num_rows, q.num_cols, q.bits
    per = 8 // bits
    shifts = torch.arange(per, device=q.packed.device, dtype=torch.uint8) * bits
    codes = (q.packed[:, :, None] >> shifts) & ((1 << bits) - 1)
    codes = codes.reshape(n, q.packed.shape[1] * per)[:, :f].to(torch.float32)  # n may be 0
    return q.row_min[:, None] + codes * q.row_scale[:, None]


def quantize(
    X: torch.Tensor, bits: int, stochastic: bool = True, seed: int | None = None
) -> QuantizedRows:
    """Quantize every row of ``X`` to ``bits`` bits with its own minimum and scale.

    Args:
        X: floating point [N, F] (read as float32), finite values.
        bits: 8, 4 or 2.
        stochastic: unbiased stochastic rounding (default) or round to nearest.
        seed: seed of the stochastic rounding; ``None`` draws one from torch's generator.

    Returns:
        :class:`QuantizedRows` (float32 ``row_min`` / ``row_scale``).

    Dispatch (:func:`~fullgraph.kernels.backend.select_backend`): Triton on CUDA, the numba
    kernel (:mod:`fullgraph.kernels.quantize_cpu`) on CPU, :func:`quantize_torch` (the reference,
    ``FULLGRAPH_KERNEL=torch``) otherwise; all give the same bytes.

    Raises:
        ConfigError: for bits outside 8, 4, 2. FullgraphError: for a non-2-D or integer ``X``.
    """
    check_bits(bits)
    if X.dim() != 2 or not X.dtype.is_floating_point:
        raise FullgraphError(f"quantize: X must be a 2-D float tensor, got {X.dtype} {X.shape}")
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()).item()) if stochastic else 0
    key = seed_key(seed)
    backend = select_backend(X.device, "quantize")
    if backend == "cpu":
        from fullgraph.kernels.quantize_cpu import quantize_cpu

        return quantize_cpu(X, bits, stochastic, key)
    if backend == "triton":
        from fullgraph.kernels.quantize_triton import quantize_triton

        return quantize_triton(X, bits, stochastic, key)
    return quantize_torch(X, bits, stochastic, key)


def quantize_to_bytes(
    X: torch.Tensor,
    bits: int,
    stochastic: bool = True,
    seed: int = 0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``quantize(X + residual, ...).to_bytes()``: rows straight into one wire buffer.

    Args:
        X: float [N, F].
        bits, stochastic, seed: as :func:`quantize`.
        residual: error feedback: float32 [N, F], contiguous, on ``X``'s device, added before
            quantizing and left holding the new quantization error (in place); ``None``: none.

    Returns:
        uint8 [N * record_nbytes(F, bits)]. The numba CPU kernel writes the records in one pass
        (feedback included); other back-ends quantize, pack and dequantize in steps; same bytes.
    """
    check_bits(bits)
    if residual is not None and (
        residual.shape != X.shape or residual.dtype != torch.float32 or not residual.is_contiguous()
    ):
        raise FullgraphError(
            f"quantize_to_bytes: residual must be contiguous float32 {tuple(X.shape)}, got "
            f"{residual.dtype} {tuple(residual.shape)}"
        )
    if select_backend(X.device, "quantize") == "cpu":
        from fullgraph.kernels.quantize_cpu import encode_records_cpu

        return encode_records_cpu(X, bits, stochastic, seed_key(seed), residual)
    v = X.to(torch.float32) if residual is None else X.to(torch.float32) + residual
    q = quantize(v, bits, stochastic=stochastic, seed=seed)
    if residual is not None:
        torch.sub(v, dequantize(q), out=residual)
    return q.to_bytes()


def dequantize_bytes(buf: torch.Tensor, num_rows: int, num_cols: int, bits: int) -> torch.Tensor:
    """Float32 [num_rows, num_cols] rows of a :func:`quantize_to_bytes` buffer."""
    check_records(buf, num_rows, num_cols, bits, "dequantize_bytes")
    if select_backend(buf.device, "dequantize") == "cpu":
        from fullgraph.kernels.quantize_cpu import decode_records_cpu

        return decode_records_cpu(buf, num_rows, num_cols, bits)
    return dequantize(QuantizedRows.from_bytes(buf, num_rows, num_cols, bits))


def dequantize(q: QuantizedRows) -> torch.Tensor:
    """Float32 [N, F] values of quantized rows: ``row_min + code * row_scale``.

    Dispatch as in :func:`quantize`: Triton on CUDA, the numba kernel on CPU, else plain torch.
    """
    backend = select_backend(q.packed.device, "dequantize")
    if backend == "cpu":
        from fullgraph.kernels.quantize_cpu import dequantize_cpu

        return dequantize_cpu(q)
    if backend == "triton":
        from fullgraph.kernels.quantize_triton import dequantize_triton

        return dequantize_triton(q)
    return dequantize_torch(q)


def cast_half(X: torch.Tensor, kind: str) -> torch.Tensor:
    """Cast ``X`` to ``"fp16"`` (clamped to +-65504 so that large values do not become inf) or
    ``"bf16"``; ``.float()`` casts back."""
    if kind == "fp16":
        # Clamping after the cast gives the same values (what rounds past 65504 becomes inf,
        # then 65504; NaN stays NaN) without a float32 temporary.
        finfo = torch.finfo(torch.float16)
        return X.to(torch.float16).clamp_(finfo.min, finfo.max)
    if kind == "bf16":
        return X.to(torch.bfloat16)
    raise ConfigError(f"cast_half: kind must be 'fp16' or 'bf16', got {kind!r}")
