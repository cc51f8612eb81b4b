"""Edge-list operations: check ids, symmetrise, drop self-loops and duplicates, build CSR.

All loaders funnel their edges through :func:`edges_to_csr`, so every graph that leaves
:func:`fullgraph.datasets.load` obeys the same rules. The heavy lifting is scipy.sparse's
counting-sort COO -> CSR conversion plus its per-row duplicate merge, which stays linear in the
edge count and works with int32 indices below 2**31 entries.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fullgraph.errors import DataError


def check_edge_ids(src: np.ndarray, dst: np.ndarray, num_nodes: int, what: str) -> None:
    """Raise :class:`DataError` if any edge endpoint lies outside ``[0, num_nodes)``.

    Args:
        src: source node ids of the edges.
        dst: destination node ids of the edges.
        num_nodes: number of nodes of the graph.
        what: a name for the message (dataset or file).
    """
    if src.shape != dst.shape:
        raise DataError(f"{what}: {src.shape[0]} edge sources but {dst.shape[0]} destinations")
    for ends in (src, dst):
        if ends.size == 0:
            continue
        lo, hi = int(ends.min()), int(ends.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            pos = int(np.argmax(ends == bad))
            raise DataError(f"{what}: edge {pos} has endpoint {bad} out of range [0, {num_nodes})")


def edges_to_csr(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    what: str = "graph",
) -> tuple[np.ndarray, np.ndarray]:
    """CSR of incoming edges from an edge list, with duplicates removed.

    Args:
        src: source ids ``u`` of the edges ``u -> v``, any integer dtype, shape [E].
        dst: destination ids ``v``, shape [E].
        num_nodes: number of nodes ``N``; ids must lie in ``[0, N)``.
        symmetric: add the reverse of every edge.
        remove_self_loops: drop edges ``v -> v``.
        what: a name for error messages.

    Returns:
        ``(indptr, indices)``: int64 [N+1] and int64 [nnz]; row ``v`` lists the sorted, distinct
        sources of the edges into ``v``.
    """
    src = np.asarray(src)
    dst = np.asarray(dst)
    check_edge_ids(src, dst, num_nodes, what)
    idx_dtype = np.int32 if num_nodes < 2**31 - 1 else np.int64
    src = src.astype(idx_dtype, copy=False)
    dst = dst.astype(idx_dtype, copy=False)
    if remove_self_loops:
        keep = src != dst
        if not keep.all():
            src, dst = src[keep], dst[keep]
        del keep
    if symmetric:
        rows = np.concatenate([dst, src])
        cols = np.concatenate([src, dst])
    else:
        rows, cols = dst, src
    del src, dst
    data = np.ones(rows.shape[0], dtype=np.bool_)
    mat = sp.coo_matrix((data, (rows, cols)), shape=(num_nodes, num_nodes))
    del rows, cols, data
    csr = mat.tocsr()  # counting sort by row; duplicates summed (bool: or-ed) and indices sorted
    del mat
    csr.sum_duplicates()
    indptr = csr.indptr.astype(np.int64)
    indices = csr.indices.astype(np.int64)
    return indptr, indices


def csr_to_edges(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edge list ``(src, dst)`` of a CSR of incoming edges (row = destination).

    Args:
        indptr: int64 [N+1].
        indices: int64 [E], sources of the edges into each row.

    Returns:
        ``(src, dst)``: int64 [E] each.
    """
    n = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    return np.asarray(indices, dtype=np.int64), dst


def undirected_edges(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each undirected edge of a symmetric CSR once, as ``(u, v)`` with ``u < v``.

    Args:
        indptr: int64 [N+1] of a symmetric graph without self-loops.
        indices: int64 [2M].

    Returns:
        ``(u, v)``: int64 [M] each, sorted by ``v`` then ``u``.
    """
    src, dst = csr_to_edges(indptr, indices)
    keep = src < dst
    return src[keep], dst[keep]


def is_symmetric(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether the CSR holds the reverse of every edge.

    Args:
        indptr: int64 [N+1].
        indices: int64 [E].

    Returns:
        ``True`` if ``u -> v`` present implies ``v -> u`` present.
    """
    n = indptr.shape[0] - 1
    data = np.ones(indices.shape[0], dtype=np.int8)
    mat = sp.csr_matrix((data, indices, indptr), shape=(n, n))
    return (mat != mat.T).nnz == 0


def index_to_mask(index: np.ndarray, num_nodes: int, what: str) -> np.ndarray:
    """Bool mask [num_nodes] with ``True`` at ``index``; ids out of range raise DataError.

    Args:
        index: node ids.
        num_nodes: length of the mask.
        what: a name for error messages (the split file).

    Returns:
        bool [num_nodes].
    """
    index = np.asarray(index, dtype=np.int64)
    if index.size and (index.min() < 0 or index.max() >= num_nodes):
        bad = int(index.min() if index.min() < 0 else index.max())
        raise DataError(f"{what}: node id {bad} out of range [0, {num_nodes})")
    mask = np.zeros(num_nodes, dtype=np.bool_)
    mask[index] = True
    return mask
