"""Max aggregation over a CSR's rows, with the argmax the backward pass routes through.

For every row ``i`` of a CSR ``A`` (rows = output rows, columns = rows of ``h``) and column
``f``::

    out[i, f] = max_{j in A[i]} h[j, f]      (0 for a row without entries, as PyG's scatter max)
    arg[i, f] = the j that gave it            (-1 for a row without entries)

Ties go to the candidate with the LOWEST ``key[j]`` (a rank passes the global node id of every
local row), so P ranks, whose local ids are a permutation of one process's, pick the same
neighbour; an entry repeated in a row (a duplicate edge) is one candidate. The backward pass
sends each output gradient to exactly one row: ``dh[arg[i, f], f] += dout[i, f]``.

:class:`SegmentMax` is the autograd function; it saves only ``arg`` (int32 when the rows of
``h`` allow, else int64). Two forward back-ends give the same ``out`` and ``arg``: numba on
float32 / float64 CPU tensors (rows in parallel) and vectorised torch on any device;
``tests/kernels/test_segment_max.py`` checks both against a plain loop.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from fullgraph.kernels.backend import numba_or_torch
from fullgraph.kernels.cpu_launch import numba_launch, row_ranges
from fullgraph.kernels.csr import CSRMatrix


@numba.njit(parallel=True, cache=True, nogil=True)
def _segment_max_numba(indptr, indices, h, key, out, arg):  # pragma: no cover - numba
    n, width = out.shape
    for i in numba.prange(n):
        start, stop = indptr[i], indptr[i + 1]
        if start == stop:
            for f in range(width):
                out[i, f] = 0.0
                arg[i, f] = -1
            continue
        j = indices[start]
        for f in range(width):
            out[i, f] = h[j, f]
            arg[i, f] = j
        for e in range(start + 1, stop):
            j = indices[e]
            k = key[j]
            for f in range(width):
                v = h[j, f]
                cur = out[i, f]
                if v > cur or (v == cur and k < key[arg[i, f]]):
                    out[i, f] = v
                    arg[i, f] = j


def segment_max_numba(
    a: CSRMatrix, h: torch.Tensor, key: torch.Tensor, arg_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, arg)`` by the numba kernel (float32 / float64 CPU tensors)."""
    n, width = a.num_rows, int(h.shape[1])
    out = torch.empty((n, width), dtype=h.dtype)
    arg = torch.empty((n, width), dtype=arg_dtype)
    _segment_max_numba(
        a.indptr.numpy(),
        a.indices.numpy(),
        h.detach().contiguous().numpy(),
        key.numpy(),
        out.numpy(),
        arg.numpy(),
    )
    return out, arg


def segment_max_torch(
    a: CSRMatrix, h: torch.Tensor, key: torch.Tensor, arg_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, arg)`` with vectorised torch (any device; ``[nnz, width]`` temporaries)."""
    n, width = a.num_rows, int(h.shape[1])
    rows = a.row_of_entry()
    cols = a.indices.to(torch.int64)
    vals = h.detach().index_select(0, cols)  # [nnz, width]
    index = rows.unsqueeze(1).expand(-1, width)
    out = h.new_zeros((n, width))
    out.scatter_reduce_(0, index, vals, "amax", include_self=False)
    wins = vals == out.index_select(0, rows)
    cand = torch.where(wins, key.to(h.device)[cols].unsqueeze(1), torch.iinfo(torch.int64).max)
    best = torch.full((n, width), torch.iinfo(torch.int64).max, device=h.device)
    best.scatter_reduce_(0, index, cand, "amin", include_self=True)
    chosen = torch.where(cand == best.index_select(0, rows), cols.unsqueeze(1), -1)
    arg = torch.full((n, width), -1, dtype=torch.int64, device=h.device)
    arg.scatter_reduce_(0, index, chosen, "amax", include_self=True)  # equal where chosen
    return out, arg.to(arg_dtype)


class SegmentMax(torch.autograd.Function):
    """Autograd of :func:`segment_max`; saves the argmax only."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, a: CSRMatrix, key: torch.Tensor) -> torch.Tensor:
        """The row maxima, a new tensor [a.num_rows, width] (see :func:`segment_max`)."""
        arg_dtype = torch.int32 if h.shape[0] < 2**31 else torch.int64
        backend = numba_or_torch(h.device, h.dtype, "segment_max")
        run = segment_max_numba if backend == "numba" else segment_max_torch
        out, arg = run(a, h, key, arg_dtype)
        ctx.save_for_backward(arg)
        ctx.num_src = int(h.shape[0])
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        """``dh[arg[i, f], f] += grad[i, f]``: every output gradient to its one argmax row."""
        (arg,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return route_max_gradient(grad, arg, ctx.num_src), None, None


def route_max_gradient(grad: torch.Tensor, arg: torch.Tensor, num_src: int) -> torch.Tensor:
    """``dh`` [num_src, width] with ``dh[arg[i, f], f] += grad[i, f]`` (``arg = -1``: none)."""
    width = int(grad.shape[1])
    dh = grad.new_zeros((num_src, width))
    arg = arg.to(torch.int64)
    valid = arg >= 0
    flat = arg * width + torch.arange(width, device=grad.device)
    dh.view(-1).index_add_(0, flat[valid], grad[valid])
    return dh


def segment_max(a: CSRMatrix, h: torch.Tensor, key: torch.Tensor | np.ndarray) -> torch.Tensor:
    """The maximum of ``h``'s rows over every row of ``a``'s entries, per column; autograd.

    Args:
        a: rows = output rows, columns = rows of ``h`` (values, if any, are ignored).
        h: float [a.num_cols, width].
        key: int64 [a.num_cols], distinct: the tie-break (the lowest key wins), e.g. the
            global node id of every local row.

    Returns:
        float [a.num_rows, width]; a row without entries is 0.

    Shapes:
        - ``h``: [num_cols, width] -> [num_rows, width]
    """
    if int(h.shape[0]) != a.num_cols:
        raise ValueError(f"segment_max: {int(h.shape[0])} rows of h for {a.num_cols} columns")
    if isinstance(key, np.ndarray):
        key = torch.from_numpy(np.ascontiguousarray(key, dtype=np.int64))
    if int(key.shape[0]) != a.num_cols:
        raise ValueError(f"segment_max: {int(key.shape[0])} keys for {a.num_cols} columns")
    if h.device.type == "cpu":
        a = a if a.device.type == "cpu" else a.to("cpu")
        key = key.to(torch.int64)
    return SegmentMax.apply(h, a, key)


@numba.njit(parallel=True, cache=True, nogil=True)
def _route_ordered(
    indptr, indices, row_key, x, halo, ax, ahalo, num_local, out, rowmap, bounds
):  # pragma: no cover - numba
    nf = x.shape[1]
    for c in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[c], bounds[c + 1]):
            o = out[rowmap[r]]
            k = row_key[rowmap[r]]
            for f in range(nf):
                o[f] = 0.0
            for e in range(indptr[r], indptr[r + 1]):
                col = indices[e]
                if e > indptr[r] and col == indices[e - 1]:
                    continue  # a duplicate edge is one candidate
                xr = x[col] if col < num_local else halo[col - num_local]
                ar = ax[col] if col < num_local else ahalo[col - num_local]
                for f in range(nf):
                    if ar[f] == k:
                        o[f] += xr[f]


def route_max_gradient_ordered_(
    out: torch.Tensor,
    a: CSRMatrix,
    rows: torch.Tensor,
    row_key: torch.Tensor,
    grad: torch.Tensor,
    arg_key: torch.Tensor,
    halo: torch.Tensor | None = None,
    halo_arg: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[rows[k], f] = sum of grad_e[f]`` over row ``k``'s entries ``e`` whose maximum was
    this row (``arg_e[f] == row_key[rows[k]]``), added in the order of the entries (repeated
    adjacent entries count once); the transpose of :func:`route_max_gradient` summed in a fixed
    order, so that rank counts give the same bits when the entries are in global-id order.

    Args:
        out: float [N, W], C-contiguous on the CPU (modified at ``rows``).
        a: CSR on the CPU: rows = the sources (``rows``), a column ``c < len(grad)`` reads
            ``grad[c]`` and ``arg_key[c]``, a larger one ``halo[c - len(grad)]`` and
            ``halo_arg[c - len(grad)]``.
        rows: int64 [a.num_rows], distinct.
        row_key: int64 [N], the key (global id) of every row of ``out``.
        grad: the output gradient rows, ``out``'s dtype [num_local, W].
        arg_key: int64 [num_local, W], the key of the row each output picked (``-1``: none).
        halo, halo_arg: the same of the remote output rows, or ``None``.

    Returns:
        ``out``.
    """
    width = int(grad.shape[1])
    if a.num_rows == 0 or width == 0:
        return out
    if halo is None or halo_arg is None:
        halo, halo_arg = grad.new_empty((0, width)), arg_key.new_empty((0, width))
    with numba_launch() as threads:
        _route_ordered(
            a.indptr.numpy(),
            a.indices.numpy(),
            row_key.numpy(),
            grad.contiguous().numpy(),
            halo.to(grad.dtype).contiguous().numpy(),
            arg_key.contiguous().numpy(),
            halo_arg.to(torch.int64).contiguous().numpy(),
            int(grad.shape[0]),
            out.numpy(),
            rows.numpy(),
            row_ranges(a.indptr.numpy(), threads),
        )
    return out
