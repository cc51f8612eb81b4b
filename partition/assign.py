"""Assigning every node an owner rank: METIS (multi-constraint), random, contiguous."""

from __future__ import annotations

import logging

import numba
import numpy as np
import scipy.sparse as sp

from fullgraph.datasets.graph import Graph
from fullgraph.errors import ConfigError, PartitionError

logger = logging.getLogger(__name__)

#: Partitioning methods :func:`assign_parts` accepts.
METHODS = ("metis", "random", "contiguous")

#: Imbalance (max / mean) above which a k-way METIS result is retried with recursive bisection.
BALANCE_TOLERANCE = 1.05


def check_num_parts(num_parts: int, num_nodes: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= num_parts <= num_nodes``."""
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise ConfigError(f"number of parts must be an integer, got {num_parts!r}")
    if num_parts < 1:
        raise ConfigError(f"number of parts must be at least 1, got {num_parts}")
    if num_parts > num_nodes:
        raise ConfigError(f"cannot split {num_nodes} nodes into {num_parts} parts (P > num_nodes)")


@numba.njit(cache=True, nogil=True)
def _is_simple_symmetric(indptr, indices):  # pragma: no cover - compiled by numba
    """True iff every row is strictly increasing, holds no self-loop, and ``u -> v`` has ``v -> u``.

    One pass over the rows ``u`` in ascending order: each entry ``v`` of row ``u`` must be the
    next unmatched entry of row ``v`` (a cursor per row). The rows ``u`` listing ``v`` come in
    ascending order, so every cursor reaching its row's end means row ``v`` is exactly that
    ascending list: the transpose equals the matrix. Needs one node-sized cursor array and no
    edge-sized temporary; memory-mapped arrays are read in place.
    """
    n = indptr.shape[0] - 1
    cursor = indptr[:-1].copy()
    for u in range(n):
        prev = -1
        for e in range(indptr[u], indptr[u + 1]):
            v = indices[e]
            if v <= prev or v == u:
                return False
            prev = v
            c = cursor[v]
            if c == indptr[v + 1] or indices[c] != u:
                return False
            cursor[v] = c + 1
    for v in range(n):
        if cursor[v] != indptr[v + 1]:
            return False
    return True


def symmetric_adjacency(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the graph made undirected, without self-loops or duplicate edges.

    A graph that is already symmetric, sorted and free of self-loops (what the loaders return)
    is passed through without a copy: the returned arrays are ``graph.indptr`` and
    ``graph.indices`` themselves (memory-mapped ones stay memory-mapped), checked by one pass
    without edge-sized temporaries. Otherwise ``A + A^T`` is built with scipy.

    Args:
        graph: the input graph (directed or not).

    Returns:
        ``(xadj, adjncy)`` as int64 arrays, the form METIS takes.

    Shapes:
        - ``xadj``: [num_nodes + 1]; ``adjncy``: [number of undirected edges * 2]
    """
    n = graph.num_nodes
    indptr = np.asarray(graph.indptr).astype(np.int64, copy=False)
    indices = np.asarray(graph.indices).astype(np.int64, copy=False)
    if _is_simple_symmetric(indptr, indices):
        return indptr, indices
    a = sp.csr_matrix(
        (np.ones(graph.num_edges, dtype=np.bool_), indices, indptr), shape=(n, n), copy=False
    )
    s = (a + a.T.tocsr()).tocsr()  # sorted, duplicates summed
    del a
    if s.diagonal().any():
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(s.indptr))
        keep = rows != s.indices
        xadj = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows[keep], minlength=n), out=xadj[1:])
        return xadj, s.indices[keep].astype(np.int64)
    return s.indptr.astype(np.int64, copy=False), s.indices.astype(np.int64, copy=False)


def imbalance(owner: np.ndarray, weights: np.ndarray, num_parts: int) -> float:
    """Largest part's share of ``weights`` over the mean share (1.0 = perfect balance)."""
    totals = np.bincount(owner, weights=weights, minlength=num_parts)
    mean = totals.sum() / num_parts
    return float(totals.max() / mean) if mean > 0 else 1.0


def _note(notes: list[str], message: str) -> None:
    """Log ``message`` as a warning and keep it for the partition report."""
    logger.warning(message)
    notes.append(message)


def _metis(graph: Graph, num_parts: int, seed: int, notes: list[str]) -> np.ndarray:
    """Multi-constraint METIS on the symmetrised graph; see :func:`assign_parts`."""
    import pymetis

    n = graph.num_nodes
    xadj, adjncy = symmetric_adjacency(graph)
    adjacency = pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy)
    ones = np.ones(n, dtype=np.int64)
    train = graph.train_mask.astype(np.int64)
    edges = graph.in_degree()
    constraints = {"nodes": ones, "train": train, "edges": edges}
    if not train.any():
        del constraints["train"]
        _note(notes, "metis: graph has no training nodes; balancing nodes and edges only")
    if not edges.any():
        del constraints["edges"]
        _note(notes, "metis: graph has no edges; balancing without the edge constraint")

    def run(names: list[str], recursive: bool) -> np.ndarray:
        vweights = np.ascontiguousarray(np.stack([constraints[k] for k in names], axis=1).ravel())
        options = pymetis.Options(seed=int(seed))
        try:
            result = pymetis.part_graph(
                num_parts, adjacency, vweights=vweights, options=options, recursive=recursive
            )
        except Exception as exc:  # METIS reports failures as RuntimeError or MemoryError
            raise PartitionError(
                f"METIS failed on {graph.name} ({' + '.join(names)} constraints): {exc}"
            ) from exc
        return np.asarray(result.vertex_part, dtype=np.int64)

    def worst(owner: np.ndarray, names: list[str]) -> float:
        return max(imbalance(owner, constraints[k], num_parts) for k in names)

    names = list(constraints)
    try:
        owner = run(names, recursive=False)
    except PartitionError as exc:
        if "train" not in names:
            raise
        _note(notes, f"metis: {exc.__cause__}; retrying with nodes + edges constraints only")
        names = [k for k in names if k != "train"]
        owner = run(names, recursive=False)
    if num_parts > 1 and worst(owner, names) > BALANCE_TOLERANCE:
        retry = run(names, recursive=True)
        note = (
            f"metis: k-way imbalance {worst(owner, names):.3f} > {BALANCE_TOLERANCE}; "
            f"recursive bisection gives {worst(retry, names):.3f}"
        )
        if worst(retry, names) < worst(owner, names):
            owner = retry
            note += " (kept)"
        _note(notes, note)
    return owner


def assign_parts(
    graph: Graph,
    num_parts: int,
    method: str = "metis",
    seed: int = 0,
    notes: list[str] | None = None,
) -> np.ndarray:
    """Choose the owner rank of every node.

    ``metis`` runs k-way METIS (pymetis) on the symmetrised graph without self-loops with three
    balance constraints per node: 1 (nodes), 1 if a training node (train nodes), in-degree
    (stored edges). When METIS rejects three constraints it retries with nodes + edges, and when
    the k-way result misses :data:`BALANCE_TOLERANCE` it tries recursive bisection; both are
    logged and added to ``notes``. ``random`` deals a seeded permutation round-robin (node counts
    equal to within one); ``contiguous`` gives rank ``r`` the id range ``[r*N/P, (r+1)*N/P)``.

    Args:
        graph: the graph to split.
        num_parts: number of parts P, ``1 <= P <= graph.num_nodes``.
        method: one of :data:`METHODS`.
        seed: seed of METIS or of the random permutation.
        notes: if given, messages about fallbacks are appended to it.

    Returns:
        int64 [num_nodes], owner rank of every node in ``[0, P)``.

    Raises:
        ConfigError: bad ``num_parts`` or unknown ``method``.
    """
    check_num_parts(num_parts, graph.num_nodes)
    if method not in METHODS:
        raise ConfigError(f"unknown partition method {method!r} (choose from {', '.join(METHODS)})")
    notes = [] if notes is None else notes
    n = graph.num_nodes
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    if method == "contiguous":
        return np.arange(n, dtype=np.int64) * num_parts // n
    if method == "random":
        owner = np.empty(n, dtype=np.int64)
        owner[np.random.default_rng(seed).permutation(n)] = np.arange(n) % num_parts
        return owner
    return _metis(graph, num_parts, seed, notes)
