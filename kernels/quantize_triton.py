"""Triton kernels of :mod:`fullgraph.kernels.quantize` (one program per row).

Quantize: a first sweep finds the row's min and max, a second computes codes for a
``[BLOCK_B, 8 // bits]`` tile (byte, slot), shifts them into place and sums each byte. The
stochastic-rounding noise is the same lowbias32 hash of ``(key, row, column)`` as the torch path,
so both give the same codes (up to float rounding on GPUs that fuse multiply-adds).
Dequantize: the reverse, one tile of bytes at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fullgraph.kernels.quantized_rows import QuantizedRows, packed_width
from fullgraph.kernels.spmm_triton import kernel_for


@triton.jit
def _quantize_kernel(
    x_ptr,
    packed_ptr,
    min_ptr,
    scale_ptr,
    num_cols,
    width,
    stride_xr,
    stride_xf,
    stride_pr,
    key,
    BITS: tl.constexpr,
    PER: tl.constexpr,
    LEVELS: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xr
    lo = tl.full([BLOCK_F], float("inf"), tl.float32)
    hi = tl.full([BLOCK_F], float("-inf"), tl.float32)
    for f0 in range(0, num_cols, BLOCK_F):
        offs = f0 + tl.arange(0, BLOCK_F)
        m = offs < num_cols
        v = tl.load(x_row + offs * stride_xf, mask=m, other=0.0).to(tl.float32)
        lo = tl.minimum(lo, tl.where(m, v, float("inf")))
        hi = tl.maximum(hi, tl.where(m, v, float("-inf")))
    mn = tl.min(lo, axis=0)
    mx = tl.max(hi, axis=0)
    scale = tl.math.div_rn(mx - mn, tl.full([], LEVELS, tl.float32))  # IEEE, like torch
    safe = tl.where(scale > 0, scale, 1.0)
    inv = tl.where(scale > 0, tl.math.div_rn(tl.full([], 1.0, tl.float32), safe), 0.0)
    tl.store(min_ptr + row, mn)
    tl.store(scale_ptr + row, scale)
    c1 = tl.full([], 0x7FEB352D, tl.uint32)
    c2 = tl.full([], 0x846CA68B, tl.uint32)
    k1 = row.to(tl.uint32) ^ key.to(tl.uint32)
    k1 = k1 ^ (k1 >> 16)
    k1 = k1 * c1
    k1 = k1 ^ (k1 >> 15)
    k1 = k1 * c2
    k1 = k1 ^ (k1 >> 16)
    slots = tl.arange(0, PER)
    for b0 in range(0, width, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        cols = offs_b[:, None] * PER + slots[None, :]
        m = cols < num_cols
        v = tl.load(x_row + cols * stride_xf, mask=m, other=0.0).to(tl.float32)
        v = (v - mn) * inv
        if STOCHASTIC:
            h = k1 + cols.to(tl.uint32)
            h = h ^ (h >> 16)
            h = h * c1
            h = h ^ (h >> 15)
            h = h * c2
            h = h ^ (h >> 16)
            v = v + (h >> 8).to(tl.float32) * (1.0 / 16777216.0)
        else:
            v = v + 0.5
        q = tl.minimum(tl.maximum(tl.floor(v), 0.0), LEVELS)
        q = tl.where(m, q, 0.0).to(tl.int32)
        byte = tl.sum(q << (slots[None, :] * BITS), axis=1)
        tl.store(
            packed_ptr + row.to(tl.int64) * stride_pr + offs_b,
            byte.to(tl.uint8),
            mask=offs_b < width,
        )


@triton.jit
def _dequantize_kernel(
    packed_ptr,
    min_ptr,
    scale_ptr,
    out_ptr,
    num_cols,
    width,
    stride_pr,
    stride_or,
    BITS: tl.constexpr,
    PER: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    row = tl.program_id(0)
    mn = tl.load(min_ptr + row)
    scale = tl.load(scale_ptr + row)
    slots = tl.arange(0, PER)
    for b0 in range(0, width, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        byte = tl.load(
            packed_ptr + row.to(tl.int64) * stride_pr + offs_b, mask=offs_b < width, other=0
        ).to(tl.int32)
        codes = (byte[:, None] >> (slots[None, :] * BITS)) & LEVELS
        cols = offs_b[:, None] * PER + slots[None, :]
        v = mn + codes.to(tl.float32) * scale
        tl.store(out_ptr + row.to(tl.int64) * stride_or + cols, v, mask=cols < num_cols)


def _block_bytes(width: int) -> int:
    return min(256, max(16, triton.next_power_of_2(max(width, 1))))


def quantize_triton(X: torch.Tensor, bits: int, stochastic: bool, key: int) -> QuantizedRows:
    """The Triton path of :func:`fullgraph.kernels.quantize` (``key`` from ``seed_key``)."""
    n, f = X.shape
    width = packed_width(f, bits)
    dev = X.device
    packed = torch.zeros((n, width), dtype=torch.uint8, device=dev)
    row_min = torch.zeros(n, dtype=torch.float32, device=dev)
    row_scale = torch.zeros(n, dtype=torch.float32, device=dev)
    if n and f:
        kernel = kernel_for(_quantize_kernel, dev)
        block_f = min(1024, max(16, triton.next_power_of_2(f)))
        kernel[(n,)](
            X,
            packed,
            row_min,
            row_scale,
            f,
            width,
            X.stride(0),
            X.stride(1),
            packed.stride(0),
            key,
            BITS=bits,
            PER=8 // bits,
            LEVELS=(1 << bits) - 1,
            STOCHASTIC=stochastic,
            BLOCK_F=block_f,
            BLOCK_B=_block_bytes(width),
        )
    return QuantizedRows(packed, row_min, row_scale, bits, f)


def dequantize_triton(q: QuantizedRows) -> torch.Tensor:
    """The Triton path of :func:`fullgraph.kernels.dequantize`."""
    n, f = q.num_rows, q.num_cols
    out = torch.empty((n, f), dtype=torch.float32, device=q.packed.device)
    width = packed_width(f, q.bits)
    if n and f:
        kernel = kernel_for(_dequantize_kernel, q.packed.device)
        packed = q.packed.contiguous()
        kernel[(n,)](
            packed,
            q.row_min.contiguous(),
            q.row_scale.contiguous(),
            out,
            f,
            width,
            packed.stride(0),
            out.stride(0),
            BITS=q.bits,
            PER=8 // q.bits,
            LEVELS=(1 << q.bits) - 1,
            BLOCK_B=_block_bytes(width),
        )
    return out
