"""``spmm(A, X) = A @ X``: the aggregation of every GNN layer, autograd-aware with respect to X.

The forward runs on the chosen back-end (:mod:`fullgraph.kernels.backend`); the backward is
``A^T @ dY`` on the same back-end, using the transpose cached on the :class:`CSRMatrix` (built
once per graph, never per call, and never an atomic scatter).
"""

from __future__ import annotations

import torch

from fullgraph.errors import FullgraphError
from fullgraph.kernels.backend import select_backend
from fullgraph.kernels.csr import CSRMatrix

#: Entries gathered per chunk by the torch reference (bounds its temporary memory).
_REFERENCE_CHUNK_ELEMENTS = 1 << 24


def spmm_reference(
    A: CSRMatrix, X: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``A @ X`` in plain torch (gather, scale, ``index_add_``), on any device; autograd-aware.

    Works in chunks of non-zeros so that the gathered temporary stays below 64 MB (float32).

    Args:
        A: CSRMatrix on the device of ``X``.
        X: [A.num_cols, F] floating point.
        out_dtype: the output's dtype (default that of ``X``).

    Returns:
        ``A @ X``, [A.num_rows, F] (accumulated in float32 for 16-bit inputs).
    """
    acc_dtype = torch.float32 if X.dtype in (torch.float16, torch.bfloat16) else X.dtype
    if out_dtype == torch.float64:
        acc_dtype = torch.float64
    nf = X.shape[1]
    out = torch.zeros((A.num_rows, nf), dtype=acc_dtype, device=X.device)
    final = out_dtype or X.dtype
    if A.nnz == 0 or nf == 0:
        return out.to(final)
    rows = A.row_of_entry()
    cols = A.indices.to(torch.int64)
    step = max(1, _REFERENCE_CHUNK_ELEMENTS // max(nf, 1))
    # 16-bit rows: float32 products (as the kernels form them), then summed in acc_dtype
    prod_dtype = torch.float32 if X.dtype in (torch.float16, torch.bfloat16) else acc_dtype
    for s in range(0, A.nnz, step):
        g = X.index_select(0, cols[s : s + step]).to(prod_dtype)
        if A.values is not None:
            g = g * A.values[s : s + step, None].to(prod_dtype)
        out = out.index_add(0, rows[s : s + step], g.to(acc_dtype))
    return out.to(final)


def spmm_forward(
    A: CSRMatrix, X: torch.Tensor, backend: str, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``A @ X`` on ``backend``, without autograd; ``out_dtype`` as in :func:`spmm`.

    ``backend`` is ``"triton"``, ``"torch"``, ``"cpu"`` (implementation from
    ``FULLGRAPH_CPU_SPMM`` or the default) or ``"cpu-numba"`` / ``"cpu-embedding_bag"``.
    """
    if backend.startswith("cpu"):
        from fullgraph.kernels.spmm_cpu import spmm_cpu

        return spmm_cpu(A, X, backend.partition("-")[2] or None, out_dtype)
    if backend == "triton":
        from fullgraph.kernels.spmm_triton import spmm_triton

        return spmm_triton(A, X, out_dtype)
    with torch.no_grad():
        return spmm_reference(A, X, out_dtype)


class SpmmFunction(torch.autograd.Function):
    """Autograd for ``Y = A @ X`` with a constant sparse ``A``: ``dX = A^T @ dY``."""

    @staticmethod
    def forward(
        ctx, X: torch.Tensor, A: CSRMatrix, backend: str, out_dtype: torch.dtype | None
    ) -> torch.Tensor:
        ctx.A = A
        ctx.backend = backend
        return spmm_forward(A, X, backend, out_dtype)

    @staticmethod
    def backward(ctx, dY: torch.Tensor):
        dX = spmm_forward(ctx.A.t(), dY, ctx.backend) if ctx.needs_input_grad[0] else None
        return dX, None, None, None


def spmm(A: CSRMatrix, X: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``Y = A @ X``, differentiable with respect to ``X``.

    Dispatch: Triton on CUDA, the CPU kernel on CPU, the torch reference as fallback;
    ``FULLGRAPH_KERNEL=triton|cpu|torch`` forces one (see :mod:`fullgraph.kernels.backend`).

    Args:
        A: the sparse operator (on the device of ``X``).
        X: float32 (or bfloat16 / float16 / float64) [A.num_cols, F], any strides.
        out_dtype: the dtype of ``Y`` (default that of ``X``): ``torch.float32`` keeps the
            float32 sums of a bfloat16 ``X`` instead of rounding them; ``torch.float64`` sums
            in float64, where the sums of bfloat16 rows are exact, whatever their order
            (bf16-mixed training: P ranks then add a row's terms as one process does).

    Returns:
        Y, [A.num_rows, F], dtype ``out_dtype`` or that of ``X``.

    Shapes:
        - A: [N_rows, N_cols] sparse
        - X: [N_cols, F]
        - Y: [N_rows, F]

    Raises:
        FullgraphError: when shapes or devices do not match.
        ConfigError: when a forced back-end cannot run.
    """
    if not isinstance(A, CSRMatrix):
        raise FullgraphError(f"spmm: A must be a CSRMatrix, got {type(A).__name__}")
    if X.dim() != 2 or X.shape[0] != A.num_cols:
        raise FullgraphError(
            f"spmm: X has shape {tuple(X.shape)}, expected ({A.num_cols}, F) for A of shape "
            f"{A.shape}"
        )
    if not X.dtype.is_floating_point:
        raise FullgraphError(f"spmm: X must be floating point, got {X.dtype}")
    if X.device.type != A.device.type:
        raise FullgraphError(f"spmm: X is on {X.device} but A is on {A.device}; use A.to()")
    backend = select_backend(X.device, "spmm")
    if torch.is_grad_enabled() and X.requires_grad:
        return SpmmFunction.apply(X, A, backend, out_dtype)
    return spmm_forward(A, X, backend, out_dtype)


def spmm_exact(
    A: CSRMatrix, X: torch.Tensor, slot: torch.Tensor, partial: torch.Tensor
) -> torch.Tensor:
    """``A @ X`` of bfloat16 ``X`` without autograd, every row summed in float64 and rounded
    once to float32, so that the order of a row's entries does not matter (bf16-mixed
    training: P ranks add a row's inner and halo terms in another order than one process).

    Rows with ``slot[r] >= 0`` are not finished: their float64 sums go to
    ``partial[slot[r]]``, for the caller to add further terms (:func:`spmm_add_` into
    ``partial``) before rounding them. CPU: the numba kernel, no ``[rows, F]`` float64
    temporary; elsewhere the product in float64, then rounded.

    Args:
        A: the sparse operator on ``X``'s device.
        X: bfloat16 [A.num_cols, F].
        slot: int64 [A.num_rows], ``-1`` or a row of ``partial``.
        partial: float64 [rows, F], contiguous (modified).

    Returns:
        float32 [A.num_rows, F] (the rows sent to ``partial`` unset).
    """
    backend = select_backend(X.device, "spmm")
    if backend.startswith("cpu"):
        from fullgraph.kernels.spmm_cpu import spmm_numba_exact

        return spmm_numba_exact(A, X, slot, partial)
    y = spmm_forward(A, X, backend, torch.float64)
    rows = torch.nonzero(slot >= 0, as_tuple=True)[0]
    if rows.numel():
        partial[slot[rows]] = y[rows]
    return y.float()


#: Output elements of one row block of :func:`spmm_add_`'s product off the CPU kernel (8 MB of
#: float32): the product is added a block at a time, so its temporary stays this small.
ADD_BLOCK_ELEMENTS = 1 << 21


def spmm_add_(
    out: torch.Tensor, A: CSRMatrix, X: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """``out += A @ X`` in place (``out[rows] += A @ X`` with ``rows``), without autograd.

    On the CPU (float32 / float64, or bfloat16 rows into a float32 ``out``) the numba kernel
    adds straight into ``out``: no temporary, and rows of ``A`` without entries cost only their
    row pointer. Elsewhere the product is added one row block of at most
    :data:`ADD_BLOCK_ELEMENTS` elements at a time, accumulated in ``out``'s dtype.

    Args:
        out: contiguous (modified): [A.num_rows, F], or any number of rows with ``rows``.
        A: the sparse operator on ``out``'s device.
        X: [A.num_cols, F] of ``out``'s dtype (or bfloat16 into a float32 / float64 ``out``).
        rows: the row of ``out`` each row of ``A`` adds into (int64, distinct), or ``None``.

    Returns:
        ``out``.
    """
    if A.nnz == 0 or X.shape[1] == 0:
        return out
    backend = select_backend(X.device, "spmm")
    same = X.dtype == out.dtype and X.dtype in (torch.float32, torch.float64)
    mixed = X.dtype == torch.bfloat16 and out.dtype in (torch.float32, torch.float64)
    if backend.startswith("cpu") and (same or mixed):
        from fullgraph.kernels.spmm_cpu import spmm_add_numba

        return spmm_add_numba(out, A, X, rows)
    step = max(1, ADD_BLOCK_ELEMENTS // max(int(X.shape[1]), 1))
    for start in range(0, A.num_rows, step):
        stop = min(start + step, A.num_rows)
        block = A.row_block(start, stop)
        if not block.nnz:
            continue
        if rows is None:
            out[start:stop] += spmm_forward(block, X, backend, out.dtype)
        else:
            out.index_add_(0, rows[start:stop], spmm_forward(block, X, backend, out.dtype))
    return out


def spmm_ordered_(
    out: torch.Tensor,
    A: CSRMatrix,
    rows: torch.Tensor,
    X: torch.Tensor,
    halo: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[rows] = A @ [X; halo]`` in place, without autograd, every row's terms added in
    the order of its entries in one pass: rows with the same entries (in the same order) and
    the same source rows give the same bits wherever their sources live, in ``X`` or in
    ``halo`` (the contract of the rank-count-invariant aggregation,
    :mod:`fullgraph.distributed.ordered`).

    CPU (float32, float64, bfloat16 ``X``): the numba kernel reads both buffers, no copy.
    Elsewhere ``[X; halo]`` is concatenated and the back-end's kernel computes the rows (Triton
    walks a row's entries in order, in tiles aligned to the row's start: the same entries give
    the same bits).

    Args:
        out: contiguous [N, F] (modified at ``rows`` only): float32 for a 16-bit ``X`` (its
            sums float64 on the CPU, float32 elsewhere, rounded once), or ``X``'s 16-bit dtype
            (those float32 sums rounded once more), else ``X``'s dtype.
        A: the rows to compute; a column ``c < X.shape[0]`` reads ``X[c]``, a larger one
            ``halo[c - X.shape[0]]``.
        rows: int64 [A.num_rows], distinct rows of ``out``.
        X: [num_local, F] floating point on ``out``'s device.
        halo: [A.num_cols - num_local, F] of ``X``'s dtype, or ``None`` (``A`` reads ``X``
            only).

    Returns:
        ``out``.

    Raises:
        FullgraphError: ``A`` reads more rows than ``X`` and ``halo`` hold.
    """
    have = int(X.shape[0]) + (0 if halo is None else int(halo.shape[0]))
    if A.num_cols > have:
        raise FullgraphError(f"spmm_ordered_: A has {A.num_cols} columns, X and halo {have} rows")
    if A.num_rows == 0 or X.shape[1] == 0:
        return out
    backend = select_backend(X.device, "spmm")
    if backend.startswith("cpu") and X.dtype in (torch.float32, torch.float64, torch.bfloat16):
        from fullgraph.kernels.spmm_cpu import spmm_ordered_numba

        return spmm_ordered_numba(out, A, rows, X, halo)
    src = X if halo is None or halo.shape[0] == 0 else torch.cat([X, halo.to(X.dtype)])
    if src.shape[0] != A.num_cols:
        A = CSRMatrix._trusted(A.indptr, A.indices, A.values, A.num_rows, int(src.shape[0]))
    wide = torch.float32 if out.dtype in (torch.bfloat16, torch.float16) else out.dtype
    out.index_copy_(0, rows, spmm_forward(A, src, backend, wide).to(out.dtype))
    return out
