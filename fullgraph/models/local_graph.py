"""A part's arrays as torch tensors: what the layer kinds build their operators from.

A part's arrays are numpy arrays, in memory or memory-mapped (:class:`fullgraph.partition.
Partition`); :func:`as_tensor` shares an in-memory array and copies a read-only map, so that
nothing writes through to a part file. :func:`local_csr` is the part's local CSR of incoming
edges without values (rows = inner nodes, columns = local ids: inner first, then halo), the
structure every kind's operator (:meth:`~fullgraph.models.layers.GraphLayer.operator`) weighs;
:func:`sum_operator` and :func:`no_operator` are the operators several kinds share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fullgraph.kernels import CSRMatrix

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from fullgraph.partition import Partition


def as_tensor(a: ArrayLike, dtype: type[np.generic]) -> torch.Tensor:
    """``a`` as a CPU tensor of ``dtype``, sharing its memory when ``a`` is a writable,
    contiguous in-memory array of that dtype, else a copy (read-only memory maps are copied,
    so nothing writes through to a part file)."""
    arr = np.asarray(a)
    if arr.dtype == dtype and arr.flags.writeable and arr.flags.c_contiguous:
        return torch.from_numpy(arr)
    return torch.from_numpy(np.array(arr, dtype=dtype))


def local_csr(part: Partition) -> CSRMatrix:
    """The part's local CSR of incoming edges, no values: rows = inner nodes, columns = local
    ids (``num_inner + num_halo``)."""
    return CSRMatrix(
        as_tensor(part.indptr, np.int64),
        as_tensor(part.indices, np.int64),
        None,
        int(part.num_inner) + int(part.num_halo),
    )


def in_degree(part: Partition) -> torch.Tensor:
    """GLOBAL in-degree of every local node, int64 [num_inner + num_halo]."""
    return as_tensor(part.in_degree, np.int64)


def sum_operator(base: CSRMatrix) -> CSRMatrix:
    """The plain sum over every row's incoming neighbours (every value 1)."""
    return base.with_values(torch.ones(int(base.indices.numel()), dtype=torch.float32))


def no_operator(base: CSRMatrix, num_inner: int) -> CSRMatrix:
    """An operator without entries (the max layers read the edges, not an operator)."""
    empty = torch.zeros(0, dtype=torch.int64)
    return CSRMatrix(
        torch.zeros(num_inner + 1, dtype=torch.int64), empty, empty.float(), base.num_cols
    )
