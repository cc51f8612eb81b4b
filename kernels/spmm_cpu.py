"""CPU sparse-times-dense kernels: our numba kernel and FBGEMM's gather-reduce.

The numba kernel splits the rows into one range per thread holding the same number of
non-zeros (a hub row is not split: its range is that row), and for every row accumulates
``sum_e w_e * X[col_e, :]`` into the output row, which stays in L1 across the feature width.
Features are float32 or float64; bfloat16 features are read as 16-bit words and widened in the
kernel, so a bf16 ``X`` moves half the bytes (the output is float32 then cast back).

``spmm_embedding_bag`` is the same product through ``F.embedding_bag(mode="sum",
per_sample_weights=...)`` (FBGEMM's JIT-compiled gather-reduce inside torch, on torch's
intra-op threads). The benchmark (`bench/kernels.py`) measures both; :data:`DEFAULT_CPU_IMPL`
names the faster one on our machine (FBGEMM: see docs/kernels.md), and
``FULLGRAPH_CPU_SPMM=numba|embedding_bag`` chooses at run time.
"""

from __future__ import annotations

import os

import numba
import numpy as np
import torch
import torch.nn.functional as F
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from fullgraph.errors import ConfigError
from fullgraph.kernels.cpu_launch import numba_launch, row_ranges
from fullgraph.kernels.csr import CSRMatrix

#: The CPU implementation ``spmm`` uses unless ``FULLGRAPH_CPU_SPMM`` names another: FBGEMM's
#: gather-reduce measured 1.2-1.8x faster than our numba kernel at F >= 128 (docs/kernels.md).
DEFAULT_CPU_IMPL = "embedding_bag"
CPU_IMPLS = ("numba", "embedding_bag")
CPU_IMPL_ENV = "FULLGRAPH_CPU_SPMM"
#: How many non-zeros ahead the numba kernel prefetches the gathered row (all its cache lines).
PREFETCH_DISTANCE = 16


@intrinsic
def _prefetch_row(typingctx, arr, row):  # pragma: no cover - compiled by numba
    """Emit ``llvm.prefetch`` (read, keep in all levels) for every cache line of ``arr[row]``."""
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        i64 = ir.IntType(64)
        idx = args[1]
        idx = builder.sext(idx, i64) if idx.type.width < 64 else idx
        stride = builder.extract_value(ary.strides, 0)
        ptr = builder.gep(builder.bitcast(ary.data, i8p), [builder.mul(idx, stride)])
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        line = ir.Constant(i64, 64)
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), stride, line) as (off, _):
            builder.call(
                fn,
                [
                    builder.gep(ptr, [off]),
                    ir.Constant(i32, 0),
                    ir.Constant(i32, 3),
                    ir.Constant(i32, 1),
                ],
            )
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(parallel=True, cache=True, nogil=True)
def _spmm_rows(
    indptr, indices, values, has_values, x, out, bounds, accumulate=False, rowmap=None
):  # pragma: no cover - JIT
    """out[r] = sum_e values[e] * x[indices[e]] for the rows of every range in ``bounds``
    (``out[r] +=`` with ``accumulate``; row ``r`` is ``out[rowmap[r]]`` with ``rowmap``,
    whose entries are distinct).

    ``x`` must be C-contiguous (its row stride is the span prefetched).
    """
    nf = x.shape[1]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[c], bounds[c + 1]):
            acc = out[r] if rowmap is None else out[rowmap[r]]
            if not accumulate:
                for f in range(nf):
                    acc[f] = 0.0
            for e in range(indptr[r], indptr[r + 1]):
                if e < last:
                    _prefetch_row(x, indices[e + PREFETCH_DISTANCE])
                xr = x[indices[e]]
                w = values[e] if has_values else np.float32(1.0)
                for f in range(nf):
                    acc[f] += w * xr[f]


@numba.njit(parallel=True, cache=True, nogil=True)
def _spmm_rows_bf16(
    indptr, indices, values, has_values, x16, out, bounds, accumulate=False, rowmap=None
):  # pragma: no cover - JIT
    """Like ``_spmm_rows`` with ``x16`` holding bfloat16 bit patterns (uint16), ``out``
    float32."""
    nf = x16.shape[1]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        wide = np.empty(nf, np.uint32)
        xf = wide.view(np.float32)
        for r in range(bounds[c], bounds[c + 1]):
            acc = out[r] if rowmap is None else out[rowmap[r]]
            if not accumulate:
                for f in range(nf):
                    acc[f] = 0.0
            for e in range(indptr[r], indptr[r + 1]):
                if e < last:
                    _prefetch_row(x16, indices[e + PREFETCH_DISTANCE])
                xr = x16[indices[e]]
                for f in range(nf):
                    wide[f] = np.uint32(xr[f]) << np.uint32(16)
                w = values[e] if has_values else np.float32(1.0)
                for f in range(nf):
                    acc[f] += w * xf[f]


# fastmath (2.2x measured): reassociating float64 sums that are exact changes nothing, and the
# float32 products stay float32 (no contraction across the widening)
@numba.njit(parallel=True, cache=True, nogil=True, fastmath=True)
def _spmm_rows_bf16_exact(
    indptr, indices, values, has_values, x16, out, bounds, slot, partial
):  # pragma: no cover - JIT
    """Like ``_spmm_rows_bf16``, each row summed in float64 in a scratch row and rounded once
    into ``out`` (float32); a row with ``slot[r] >= 0`` goes to ``partial[slot[r]]`` in float64
    instead (its sum is not done: terms of other columns follow)."""
    nf = x16.shape[1]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        wide = np.empty(nf, np.uint32)
        xf = wide.view(np.float32)
        acc = np.empty(nf, np.float64)
        for r in range(bounds[c], bounds[c + 1]):
            for f in range(nf):
                acc[f] = 0.0
            for e in range(indptr[r], indptr[r + 1]):
                if e < last:
                    _prefetch_row(x16, indices[e + PREFETCH_DISTANCE])
                xr = x16[indices[e]]
                for f in range(nf):
                    wide[f] = np.uint32(xr[f]) << np.uint32(16)
                w = values[e] if has_values else np.float32(1.0)
                for f in range(nf):
                    acc[f] += w * xf[f]
            s = slot[r]
            if s < 0:
                o = out[r]
                for f in range(nf):
                    o[f] = acc[f]
            else:
                p = partial[s]
                for f in range(nf):
                    p[f] = acc[f]


def spmm_numba_exact(
    A: CSRMatrix, X: torch.Tensor, slot: torch.Tensor, partial: torch.Tensor
) -> torch.Tensor:
    """``A @ X`` of bfloat16 ``X``, every row summed in float64 and rounded once to float32
    (sums of bf16 x float32 products are exact in float64 unless their magnitudes span more
    than ~2^29, so the order of a row's entries does not matter).

    Args:
        A: CSRMatrix on the CPU.
        X: bfloat16 [A.num_cols, F].
        slot: int64 [A.num_rows]: ``-1``, or the row of ``partial`` that takes row ``r``'s
            float64 sum (its other terms are added there later).
        partial: float64 [rows, F], C-contiguous (written at the rows ``slot`` names).

    Returns:
        float32 [A.num_rows, F]; the rows sent to ``partial`` are left unset.
    """
    nf = X.shape[1]
    out = torch.empty((A.num_rows, nf), dtype=torch.float32)
    if A.num_rows == 0 or nf == 0:
        return out
    indptr = A.indptr.numpy()
    has_values = A.values is not None
    values = A.values.numpy() if has_values else np.empty(0, np.float32)
    x16 = X.contiguous().view(torch.int16).numpy().view(np.uint16)
    with numba_launch() as threads:
        _spmm_rows_bf16_exact(
            indptr,
            A.indices.numpy(),
            values,
            has_values,
            x16,
            out.numpy(),
            row_ranges(indptr, threads),
            slot.numpy(),
            partial.numpy(),
        )
    return out


def spmm_numba(
    A: CSRMatrix,
    X: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``A @ X`` with the numba kernel (no autograd).

    Args:
        A: CSRMatrix on the CPU.
        X: float32, float64 or bfloat16 [A.num_cols, F] on the CPU (any strides).
        out: optional preallocated contiguous output [A.num_rows, F] (float32 for bf16 ``X``,
            else ``X.dtype``).
        out_dtype: ``torch.float32`` keeps a bf16 ``X``'s float32 sums (no rounding to bf16);
            ``torch.float64`` accumulates in float64 (sums of bf16 x float32 products are then
            exact, so they do not depend on the order of the entries).

    Returns:
        ``A @ X``, [A.num_rows, F], dtype ``out_dtype`` or that of ``X``.
    """
    nf = X.shape[1]
    bf16 = X.dtype == torch.bfloat16
    acc_dtype = torch.float32 if X.dtype in (torch.bfloat16, torch.float16) else X.dtype
    if out_dtype == torch.float64:  # exact sums of bf16 rows: the same in any order
        acc_dtype = torch.float64
    if out is None:
        out = torch.empty((A.num_rows, nf), dtype=acc_dtype)
    final = out_dtype or X.dtype
    if A.num_rows == 0 or nf == 0:
        return out.to(final)
    indptr = A.indptr.numpy()
    indices = A.indices.numpy()
    has_values = A.values is not None
    values = A.values.numpy() if has_values else np.empty(0, np.float32)
    Xc = X.contiguous()
    with numba_launch() as threads:
        bounds = row_ranges(indptr, threads)
        if bf16:
            x16 = Xc.view(torch.int16).numpy().view(np.uint16)
            _spmm_rows_bf16(indptr, indices, values, has_values, x16, out.numpy(), bounds)
            return out.to(final)
        if X.dtype == torch.float16:
            Xc = Xc.to(torch.float32)
        _spmm_rows(indptr, indices, values, has_values, Xc.numpy(), out.numpy(), bounds)
    return out if out.dtype == final else out.to(final)


def spmm_add_numba(
    out: torch.Tensor, A: CSRMatrix, X: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """``out += A @ X`` in place with the numba kernel: no temporary, and rows of ``A``
    without entries cost nothing but their row pointer.

    Args:
        out: float32 or float64, C-contiguous, on the CPU (modified): [A.num_rows, F], or any
            number of rows with ``rows``.
        A: CSRMatrix on the CPU.
        X: [A.num_cols, F] of ``out``'s dtype, or bfloat16 into a float32 ``out``, on the
            CPU (any strides).
        rows: row of ``out`` of every row of ``A`` (int64, distinct), or ``None``.

    Returns:
        ``out``.
    """
    if A.nnz == 0 or X.shape[1] == 0:
        return out
    indptr = A.indptr.numpy()
    has_values = A.values is not None
    values = A.values.numpy() if has_values else np.empty(0, np.float32)
    rowmap = None if rows is None else rows.numpy()
    with numba_launch() as threads:
        bounds = row_ranges(indptr, threads)
        if X.dtype == torch.bfloat16:
            x16 = X.contiguous().view(torch.int16).numpy().view(np.uint16)
            args = (indptr, A.indices.numpy(), values, has_values, x16, out.numpy(), bounds)
            _spmm_rows_bf16(*args, True, rowmap)
        else:
            xc = X.contiguous().numpy()
            args = (indptr, A.indices.numpy(), values, has_values, xc, out.numpy(), bounds)
            _spmm_rows(*args, True, rowmap)
    return out


def spmm_embedding_bag(A: CSRMatrix, X: torch.Tensor) -> torch.Tensor:
    """``A @ X`` through FBGEMM's gather-reduce, ``F.embedding_bag(mode="sum")`` (no autograd).

    Args:
        A: CSRMatrix on the CPU.
        X: float32 or bfloat16 [A.num_cols, F] (copied to contiguous when strided).

    Returns:
        ``A @ X``, [A.num_rows, F], dtype of ``X``.
    """
    if A.nnz == 0 or X.shape[1] == 0:
        return torch.zeros((A.num_rows, X.shape[1]), dtype=X.dtype, device=X.device)
    indptr = A.indptr if A.indices.dtype == torch.int64 else A.indptr.to(torch.int32)
    weights = A.values
    if weights is not None and weights.dtype != X.dtype:
        weights = weights.to(X.dtype)
    return F.embedding_bag(
        A.indices,
        X.contiguous(),
        indptr,
        mode="sum",
        per_sample_weights=weights,
        include_last_offset=True,
    )


def cpu_impl(impl: str | None = None) -> str:
    """The CPU implementation to use: ``impl``, else ``$FULLGRAPH_CPU_SPMM``, else the default."""
    name = impl or os.environ.get(CPU_IMPL_ENV, "").strip().lower() or DEFAULT_CPU_IMPL
    if name not in CPU_IMPLS:
        raise ConfigError(f"{CPU_IMPL_ENV}={name!r} is not one of {', '.join(CPU_IMPLS)}")
    return name


def spmm_cpu(
    A: CSRMatrix, X: torch.Tensor, impl: str | None = None, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``A @ X`` on the CPU with implementation ``impl`` (see :func:`cpu_impl`), no autograd.

    A bf16 ``X`` with ``out_dtype=torch.float32`` (bf16-mixed training) always runs the numba
    kernel: FBGEMM's gather-reduce returns bf16 rows, one rounding of a partial sum that the
    other ranks' halo terms would then be added to (P ranks would no longer equal one process).
    """
    wide = out_dtype is not None and out_dtype != X.dtype
    if wide and X.dtype == torch.bfloat16:
        return spmm_numba(A, X, out_dtype=out_dtype)
    if cpu_impl(impl) == "numba":
        return spmm_numba(A, X, out_dtype=out_dtype)
    out = spmm_embedding_bag(A, X)
    return out if out_dtype is None else out.to(out_dtype)


@numba.njit(parallel=True, cache=True, nogil=True)
def _ordered_rows(
    indptr, indices, values, has_values, x, halo, num_local, out, rowmap, bounds
):  # pragma: no cover - JIT
    """out[rowmap[r]] = sum_e values[e] * src(indices[e]) for the rows of every range in
    ``bounds``, each row's terms added one after the other in the order of its entries;
    ``src(c)`` is ``x[c]`` for ``c < num_local``, else ``halo[c - num_local]``."""
    nf = x.shape[1]
    last = indices.shape[0] - PREFETCH_DISTANCE
    for c in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[c], bounds[c + 1]):
            acc = out[rowmap[r]]
            for f in range(nf):
                acc[f] = 0.0
            for e in range(indptr[r], indptr[r + 1]):
                if e < last:
                    ahead = indices[e + PREFETCH_DISTANCE]
                    if ahead < num_local:
                        _prefetch_row(x, ahead)
                    else:
                        _prefetch_row(halo, ahead - num_local)
                col = indices[e]
                xr = x[col] if col < num_local else halo[col - num_local]
                w = values[e] if has_values else np.float32(1.0)
                for f in range(nf):
                    acc[f] += w * xr[f]


@numba.njit(cache=True, nogil=True, inline="always")
def _bf16_row_sum(
    indptr, indices, values, has_values, x16, halo16, num_local, r, wide, acc
):  # pragma: no cover - JIT
    """``acc`` = row ``r``'s sum of its entries' bfloat16 source rows (``x16`` or ``halo16``
    bit patterns, widened to float32 in the scratch row ``wide``), float32 products added in
    float64 in the order of the entries: the body of both bfloat16 ordered kernels."""
    nf = x16.shape[1]
    last = indices.shape[0] - PREFETCH_DISTANCE
    xf = wide.view(np.float32)
    for f in range(nf):
        acc[f] = 0.0
    for e in range(indptr[r], indptr[r + 1]):
        if e < last:
            ahead = indices[e + PREFETCH_DISTANCE]
            if ahead < num_local:
                _prefetch_row(x16, ahead)
            else:
                _prefetch_row(halo16, ahead - num_local)
        col = indices[e]
        xr = x16[col] if col < num_local else halo16[col - num_local]
        for f in range(nf):
            wide[f] = np.uint32(xr[f]) << np.uint32(16)
        w = values[e] if has_values else np.float32(1.0)
        for f in range(nf):
            acc[f] += w * xf[f]


@numba.njit(parallel=True, cache=True, nogil=True)
def _ordered_rows_bf16(
    indptr, indices, values, has_values, x16, halo16, num_local, out, rowmap, bounds
):  # pragma: no cover - JIT
    """Like ``_ordered_rows`` with ``x16`` and ``halo16`` holding bfloat16 bit patterns
    (uint16), widened to float32; every product float32, each row summed in float64 in a
    scratch row (no fastmath: the order is the entries') and rounded once into ``out``
    (float32)."""
    nf = x16.shape[1]
    for c in numba.prange(bounds.shape[0] - 1):
        wide = np.empty(nf, np.uint32)
        acc = np.empty(nf, np.float64)
        for r in range(bounds[c], bounds[c + 1]):
            _bf16_row_sum(indptr, indices, values, has_values, x16, halo16, num_local, r, wide, acc)
            o = out[rowmap[r]]
            for f in range(nf):
                o[f] = acc[f]


@numba.njit(parallel=True, cache=True, nogil=True)
def _ordered_rows_bf16_out(
    indptr, indices, values, has_values, x16, halo16, num_local, out16, rowmap, bounds
):  # pragma: no cover - JIT
    """``_ordered_rows_bf16`` writing bfloat16 (uint16 bit patterns into ``out16``): each
    row's float64 sum rounded to float32, then to bfloat16, as ``out.float()`` then
    ``.to(torch.bfloat16)`` would, without the float32 matrix."""
    nf = x16.shape[1]
    for c in numba.prange(bounds.shape[0] - 1):
        wide = np.empty(nf, np.uint32)
        acc = np.empty(nf, np.float64)
        rounded = np.empty(nf, np.float32)  # each sum rounded to float32, read as its bits
        bits = rounded.view(np.uint32)
        for r in range(bounds[c], bounds[c + 1]):
            _bf16_row_sum(indptr, indices, values, has_values, x16, halo16, num_local, r, wide, acc)
            o = out16[rowmap[r]]
            for f in range(nf):
                rounded[f] = acc[f]
            for f in range(nf):  # to nearest even; a NaN becomes 0xFFFF (torch's vector .to)
                u = bits[f]
                if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                    o[f] = np.uint16(0xFFFF)
                else:
                    u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
                    o[f] = np.uint16(u >> np.uint32(16))


def _bits16(x: torch.Tensor) -> np.ndarray:
    """The bit patterns of a bfloat16 tensor, uint16, C-contiguous."""
    return x.contiguous().view(torch.int16).numpy().view(np.uint16)


def spmm_ordered_numba(
    out: torch.Tensor,
    A: CSRMatrix,
    rows: torch.Tensor,
    X: torch.Tensor,
    halo: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[rows[k]] = (A @ [X; halo])[k]``, every row summed in the order of its entries,
    one pass, the same kernel whatever the split of its columns between ``X`` and ``halo``.

    Args:
        out: C-contiguous on the CPU (modified at ``rows`` only): float32 or bfloat16 for
            bfloat16 ``X`` (sums in float64, rounded to float32 once, then to bfloat16 for a
            bfloat16 ``out``: the bits of ``out.float().to(torch.bfloat16)``), else ``X``'s
            dtype.
        A: CSRMatrix on the CPU; a column ``c < X.shape[0]`` reads ``X[c]``, a larger one
            ``halo[c - X.shape[0]]``.
        rows: int64 [A.num_rows], distinct: the row of ``out`` each row of ``A`` writes.
        X: float32, float64 or bfloat16 [num_local, F] (any strides).
        halo: rows of ``X``'s dtype [A.num_cols - num_local, F], or ``None`` (no such column).

    Returns:
        ``out``.
    """
    nf = int(X.shape[1])
    if A.num_rows == 0 or nf == 0:
        return out
    num_local = int(X.shape[0])
    if halo is None:
        halo = X.new_empty((0, nf))
    indptr = A.indptr.numpy()
    has_values = A.values is not None
    values = A.values.numpy() if has_values else np.empty(0, np.float32)
    if out.dtype == torch.bfloat16 and X.dtype != torch.bfloat16:
        raise ValueError("spmm_ordered_numba: a bfloat16 out needs bfloat16 X")
    # a bfloat16 out: its own memory as uint16 bit patterns, written in place
    out_np = out.view(torch.int16).numpy().view(np.uint16) if out.dtype == torch.bfloat16 else None
    args_tail = (num_local, out.numpy() if out_np is None else out_np, rows.numpy())
    with numba_launch() as threads:
        bounds = row_ranges(indptr, threads)
        if X.dtype == torch.bfloat16:
            src = (_bits16(X), _bits16(halo.to(torch.bfloat16)))
            kernel = _ordered_rows_bf16
            if out_np is not None:
                kernel = _ordered_rows_bf16_out
        else:
            src = (X.contiguous().numpy(), halo.to(X.dtype).contiguous().numpy())
            kernel = _ordered_rows
        kernel(indptr, A.indices.numpy(), values, has_values, *src, *args_tail, bounds)
    return out
