"""Triton sparse-times-dense kernel (CSR, one program per row and feature block).

Each program owns output row ``r`` and a block of ``BLOCK_F`` features. It walks the row's
non-zeros ``BLOCK_E`` at a time, gathers the ``[BLOCK_E, BLOCK_F]`` tile of ``X`` (masked at the
row end and the feature end), scales it by the edge weights and sums it into a float32
accumulator held in registers; the row is written once, in the dtype of ``X``. No atomics: the
backward is the same kernel on the cached transpose.

On CUDA tensors the kernel is compiled; on CPU tensors it runs through Triton's interpreter when
``TRITON_INTERPRET=1`` is set (how the tests check this code path without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fullgraph.errors import ConfigError
from fullgraph.kernels.backend import triton_interpret
from fullgraph.kernels.csr import CSRMatrix


@triton.jit
def _spmm_csr_kernel(
    indptr_ptr,
    indices_ptr,
    values_ptr,
    x_ptr,
    out_ptr,
    num_features,
    stride_xr,
    stride_xf,
    stride_or,
    HAS_VALUES: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
    ACC: tl.constexpr,
):
    row = tl.program_id(0)
    fblock = tl.program_id(1)
    offs_f = fblock * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = offs_f < num_features
    start = tl.load(indptr_ptr + row)
    end = tl.load(indptr_ptr + row + 1)
    acc = tl.zeros([BLOCK_F], dtype=ACC)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < end
        cols = tl.load(indices_ptr + offs_e, mask=mask_e, other=0).to(tl.int64)
        ptrs = x_ptr + cols[:, None] * stride_xr + offs_f[None, :] * stride_xf
        tile = tl.load(ptrs, mask=mask_e[:, None] & mask_f[None, :], other=0.0).to(tl.float32)
        if HAS_VALUES:
            w = tl.load(values_ptr + offs_e, mask=mask_e, other=0.0)
            tile = tile * w[:, None]
        tile = tile.to(ACC)
        acc += tl.sum(tile, axis=0)
    out_ptrs = out_ptr + row.to(tl.int64) * stride_or + offs_f
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_f)


def _launch_config(num_features: int) -> tuple[int, int, int]:
    """(BLOCK_E, BLOCK_F, num_warps) for a feature width: tiles of at most 4096 elements."""
    block_f = min(128, max(16, triton.next_power_of_2(num_features)))
    # Rows of GNN graphs hold ~10-50 entries: 16 per step wastes little on masked lanes.
    block_e = 16 if block_f >= 64 else 4096 // (block_f * 4)
    num_warps = 4 if block_f * block_e >= 2048 else 2
    return block_e, block_f, num_warps


def kernel_for(jitted, device: torch.device):
    """The runnable form of a ``@triton.jit`` kernel for tensors on ``device``.

    CUDA tensors get the compiled kernel; CPU tensors get Triton's interpreter when
    ``TRITON_INTERPRET=1``, which must be set before triton is imported.
    """
    if device.type == "cuda":
        return jitted
    if device.type == "cpu" and triton_interpret():
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(standard.zeros, InterpretedFunction):
            # triton decides at import time whether its own library functions are interpreted
            raise ConfigError(
                "TRITON_INTERPRET=1 was set after triton was imported; set it before the process "
                "imports triton (or torch_geometric, which imports it)"
            )
        return jitted if isinstance(jitted, InterpretedFunction) else InterpretedFunction(jitted.fn)
    raise ConfigError(
        f"triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for CPU ones), got {device}"
    )


def spmm_triton(
    A: CSRMatrix, X: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``A @ X`` with the Triton kernel (no autograd).

    Args:
        A: CSRMatrix on the device of ``X``.
        X: float32, bfloat16 or float16 [A.num_cols, F] (float64 is computed in float32), any
            strides.
        out_dtype: the output's dtype (``torch.float32`` keeps the float32 sums of a 16-bit
            ``X``; ``torch.float64`` also accumulates in float64); default that of ``X``.

    Returns:
        ``A @ X``, [A.num_rows, F], dtype ``out_dtype`` or that of ``X``; accumulation in
        float32.
    """
    nf = X.shape[1]
    out = torch.empty((A.num_rows, nf), dtype=out_dtype or X.dtype, device=X.device)
    if A.num_rows == 0 or nf == 0:
        return out
    if A.nnz == 0:
        return out.zero_()
    kernel = kernel_for(_spmm_csr_kernel, X.device)
    block_e, block_f, num_warps = _launch_config(nf)
    grid = (A.num_rows, triton.cdiv(nf, block_f))
    values = A.values if A.values is not None else A.indptr  # placeholder pointer, never read
    kernel[grid](
        A.indptr,
        A.indices,
        values,
        X,
        out,
        nf,
        X.stride(0),
        X.stride(1),
        out.stride(0),
        HAS_VALUES=A.values is not None,
        BLOCK_E=block_e,
        BLOCK_F=block_f,
        ACC=tl.float64 if out.dtype == torch.float64 else tl.float32,
        num_warps=num_warps,
    )
    return out
