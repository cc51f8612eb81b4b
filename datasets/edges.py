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


def check_edge_ids(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    what: str,
    *,
    first_line: int | None = None,
) -> None:
    """Raise :class:`DataError` if any edge endpoint lies outside ``[0, num_nodes)``.

    Args:
        src: source node ids of the edges.
        dst: destination node ids of the edges.
        num_nodes: number of nodes of the graph.
        what: a name for the message (dataset or file).
        first_line: the edges are a block of the file ``what`` from its 0-based line
            ``first_line`` on: the message names the line (and the edge's place in the file).
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
            where = f"edge {pos}"
            if first_line is not None:
                where = f"line {first_line + pos + 1} (edge {first_line + pos})"
            raise DataError(f"{what}: {where} has endpoint {bad} out of range [0, {num_nodes})")


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


def _check_edge_values(values: dict[str, np.ndarray], num_edges: int, what: str) -> None:
    """Raise :class:`DataError` unless every per-edge array has ``num_edges`` finite rows."""
    for key, v in values.items():
        if v.shape[0] != num_edges:
            raise DataError(f"{what}: {key} has {v.shape[0]} rows but there are {num_edges} edges")
        bad = ~np.isfinite(v.reshape(num_edges, -1)).all(axis=1)
        if bad.any():
            raise DataError(
                f"{what}: {key} holds NaN or infinite values on {int(bad.sum())} edges (first: "
                f"edge {int(np.argmax(bad))}); edge values must be finite"
            )


def edges_to_csr_with_values(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    values: dict[str, np.ndarray],
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    what: str = "graph",
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """:func:`edges_to_csr` carrying per-edge values (edge weights, edge feature rows).

    The rules that keep the values aligned with the edges:

    - a removed self-loop takes its values with it;
    - symmetrising gives the reverse edge ``v -> u`` the values of ``u -> v``;
    - duplicates (also an edge given both ways once symmetrised) keep one copy, and must carry
      equal values: different values for the same edge raise :class:`DataError` (there is no
      meaningful way to merge them that every layer would agree on).

    Args:
        src: source ids ``u`` of the edges ``u -> v``, shape [E].
        dst: destination ids ``v``, shape [E].
        num_nodes: number of nodes ``N``.
        values: per-edge arrays by name (``edge_weight`` [E], ``edge_attr`` [E, F]); finite.
        symmetric: add the reverse of every edge.
        remove_self_loops: drop edges ``v -> v``.
        what: a name for error messages.

    Returns:
        ``(indptr, indices, values)``: the CSR of :func:`edges_to_csr` and every array of
        ``values`` (float32) in the order of ``indices`` (no values: :func:`edges_to_csr`
        itself and an empty dict).
    """
    if not values:
        indptr, indices = edges_to_csr(
            src, dst, num_nodes, symmetric=symmetric, remove_self_loops=remove_self_loops, what=what
        )
        return indptr, indices, {}
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    check_edge_ids(src, dst, num_nodes, what)
    vals = {k: np.asarray(v, dtype=np.float32) for k, v in values.items()}
    _check_edge_values(vals, src.shape[0], what)
    if remove_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
        vals = {k: v[keep] for k, v in vals.items()}
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        vals = {k: np.concatenate([v, v]) for k, v in vals.items()}
    key = dst * num_nodes + src
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.ones(key.shape[0], dtype=np.bool_)
    first[1:] = key[1:] != key[:-1]
    group = np.cumsum(first) - 1  # the kept copy of every entry
    kept = order[first]
    out = {}
    for k, v in vals.items():
        v = v[order]
        same = (v.reshape(v.shape[0], -1) == v[first][group].reshape(v.shape[0], -1)).all(axis=1)
        if not same.all():
            e = int(np.argmax(~same))
            u, w = int(key[e] % num_nodes), int(key[e] // num_nodes)
            raise DataError(
                f"{what}: edge {u} -> {w} is given more than once with different {k} values; "
                f"give each edge once (or equal values for its copies)"
            )
        out[k] = np.ascontiguousarray(vals[k][kept])
    dst_sorted = dst[kept]
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst_sorted, minlength=num_nodes), out=indptr[1:])
    return indptr, src[kept].astype(np.int64), out
