"""Assigning every node an owner rank: METIS (multi-constraint), KaMinPar, random, contiguous."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import scipy.sparse as sp

from fullgraph.datasets.graph import Graph
from fullgraph.errors import ConfigError, PartitionError
from fullgraph.resources import drop_resident_pages

logger = logging.getLogger(__name__)

#: Partitioning methods :func:`assign_parts` accepts.
METHODS = ("metis", "kaminpar", "random", "contiguous")

#: METIS libraries :func:`assign_parts` can use; ``auto`` prefers a 32-bit libmetis.
METIS_LIBRARIES = ("auto", "libmetis", "pymetis")

#: How ``metis`` assigns (:func:`resolve_assign`): ``blocks``, contiguous runs of fixed node
#: blocks (:mod:`fullgraph.partition.blocks`, the default), or ``kway``, k-way METIS into P parts.
ASSIGNMENTS = ("blocks", "kway")

#: Imbalance (max / mean) above which a k-way METIS result is retried with recursive bisection.
BALANCE_TOLERANCE = 1.05

#: KaMinPar's imbalance bound: every part holds at most ``(1 + eps) * ceil(N / P)`` nodes.
KAMINPAR_EPSILON = 0.03

#: The one line :func:`assign_parts` raises when the ``kaminpar`` package cannot be imported.
KAMINPAR_MISSING = (
    "--method kaminpar: the kaminpar package is not installed (pip install kaminpar); "
    "use --method metis"
)


def check_num_parts(num_parts: int, num_nodes: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= num_parts <= num_nodes``."""
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise ConfigError(f"number of parts must be an integer, got {num_parts!r}")
    if num_parts < 1:
        raise ConfigError(f"number of parts must be at least 1, got {num_parts}")
    if num_parts > num_nodes:
        raise ConfigError(f"cannot split {num_nodes} nodes into {num_parts} parts (P > num_nodes)")


def resolve_assign(method: str, assign: str | None, block_size: int | None = None) -> str | None:
    """The assignment of ``method``: ``assign`` checked (default ``blocks`` for ``metis``;
    ``None`` for ``kaminpar`` (k-way into P parts), ``random`` and ``contiguous``, which have no
    blocks).

    Raises:
        ConfigError: unknown ``method`` or ``assign``, ``assign`` with a method other than
            ``metis``, or a block size without ``blocks``.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown partition method {method!r} (choose from {', '.join(METHODS)})")
    if assign is not None and assign not in ASSIGNMENTS:
        raise ConfigError(f"unknown assignment {assign!r} (choose from {', '.join(ASSIGNMENTS)})")
    if method != "metis":
        if assign is not None:
            raise ConfigError(f"--assign {assign} applies to --method metis, not {method}")
        assign = None
    else:
        assign = assign or "blocks"
    if block_size is not None and assign != "blocks":
        raise ConfigError("--block-size applies to --assign blocks (the default of --method metis)")
    if block_size is not None and (
        isinstance(block_size, bool)
        or not isinstance(block_size, (int, np.integer))
        or block_size < 1
    ):
        raise ConfigError(f"block size must be a positive integer, got {block_size!r}")
    return assign


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


def metis_library(
    graph: Graph, num_parts: int, library: str, notes: list[str]
) -> tuple[Callable[[np.ndarray, int, int, bool], np.ndarray], str]:
    """``(run(vweights, ncon, seed, recursive) -> owner, name)`` on the chosen METIS library.

    ``auto`` takes the libmetis of :func:`~fullgraph.partition.libmetis.find_libmetis` when its
    indices are 32-bit and the graph fits them (half the memory of pymetis' 64-bit METIS), and
    pymetis otherwise. The library used is added to ``notes``; ``name`` is ``libmetis`` or
    ``pymetis``.
    """
    import fullgraph.partition.libmetis as libmetis

    if library == "libmetis":
        lib = libmetis.require_libmetis()
    else:
        lib = libmetis.find_libmetis() if library == "auto" else None
    xadj, adjncy = symmetric_adjacency(graph)
    sums = [int(graph.num_nodes), int(graph.num_edges)]
    fits = lib is not None and libmetis.fits(lib, int(adjncy.size), sums)
    if lib is not None and library == "libmetis" and not fits:
        raise ConfigError(f"{graph.name} is too large for the indices of {lib.describe()}")
    if lib is None or library == "auto" and (lib.bits != 32 or not fits):
        import pymetis

        notes.append("metis: pymetis (64-bit idx_t)")
        adjacency = pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy)

        def run_pymetis(vweights: np.ndarray, ncon: int, seed: int, recursive: bool) -> np.ndarray:
            options = pymetis.Options(seed=int(seed))
            result = pymetis.part_graph(
                num_parts, adjacency, vweights=vweights, options=options, recursive=recursive
            )
            return np.asarray(result.vertex_part, dtype=np.int64)

        return run_pymetis, "pymetis"
    notes.append(f"metis: {lib.describe()}")
    x = libmetis.as_idx(xadj, lib.idx)
    a = libmetis.as_idx(adjncy, lib.idx)
    for array in (graph.indptr, graph.indices):  # mapped graph arrays: read once, now copied
        drop_resident_pages(array)
    del xadj, adjncy

    def run_libmetis(vweights: np.ndarray, ncon: int, seed: int, recursive: bool) -> np.ndarray:
        w = libmetis.as_idx(vweights, lib.idx)
        return libmetis.part_graph(lib, num_parts, x, a, w, ncon, int(seed), recursive)

    return run_libmetis, "libmetis"


def _metis(graph: Graph, num_parts: int, seed: int, library: str, notes: list[str]) -> np.ndarray:
    """Multi-constraint METIS on the symmetrised graph; see :func:`assign_parts`."""
    n = graph.num_nodes
    call, _ = metis_library(graph, num_parts, library, notes)
    ones = np.ones(n, dtype=np.int64)
    train = graph.train_mask.astype(np.int64)
    edges = np.diff(graph.indptr).astype(np.int64)  # stored edges (a cut: its own)
    constraints = {"nodes": ones, "train": train, "edges": edges}
    if not train.any():
        del constraints["train"]
        _note(notes, "metis: graph has no training nodes; balancing nodes and edges only")
    if not edges.any():
        del constraints["edges"]
        _note(notes, "metis: graph has no edges; balancing without the edge constraint")

    def run(names: list[str], recursive: bool) -> np.ndarray:
        vweights = np.ascontiguousarray(np.stack([constraints[k] for k in names], axis=1).ravel())
        try:
            return call(vweights, len(names), seed, recursive)
        except Exception as exc:  # METIS reports failures as RuntimeError or MemoryError
            raise PartitionError(
                f"METIS failed on {graph.name} ({' + '.join(names)} constraints): {exc}"
            ) from exc

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


def _threads() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def write_parhip(path: Path, xadj: np.ndarray, adjncy: np.ndarray) -> None:
    """Write the symmetric CSR ``(xadj, adjncy)`` as a binary ParHIP graph file (64-bit ids, no
    weights), the form ``kaminpar.load_graph`` reads; KaMinPar's binding takes no arrays."""
    n = int(xadj.size) - 1
    version = 1 | 2  # bit 0: no edge weights, bit 1: no node weights; ids and weights 64-bit
    header = np.array([version, n, int(adjncy.size)], dtype=np.uint64)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        step = 1 << 22
        for lo in range(0, n + 1, step):  # byte offsets of every row's neighbours
            chunk = xadj[lo : lo + step].astype(np.uint64) * 8 + (24 + (n + 1) * 8)
            f.write(chunk.tobytes())
        for lo in range(0, int(adjncy.size), step):
            f.write(np.asarray(adjncy[lo : lo + step], dtype=np.uint64).tobytes())


def _kaminpar(graph: Graph, num_parts: int, seed: int, notes: list[str]) -> np.ndarray:
    """k-way KaMinPar on the symmetrised graph balancing nodes; see :func:`assign_parts`."""
    try:
        import kaminpar
    except ImportError as exc:
        raise ConfigError(KAMINPAR_MISSING) from exc
    xadj, adjncy = symmetric_adjacency(graph)
    threads = _threads()
    try:
        with tempfile.TemporaryDirectory(prefix="fullgraph-kaminpar-") as tmp:
            path = Path(tmp) / "graph.parhip"
            write_parhip(path, xadj, adjncy)
            del xadj, adjncy
            kgraph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP)
        kaminpar.reseed(int(seed))
        solver = kaminpar.KaMinPar(threads, kaminpar.default_context())
        owner = solver.compute_partition(kgraph, int(num_parts), KAMINPAR_EPSILON)
    except Exception as exc:  # the binding raises RuntimeError / MemoryError / OSError
        raise ConfigError(
            f"--method kaminpar: KaMinPar failed on {graph.name}: {exc}; use --method metis"
        ) from exc
    owner = np.asarray(owner, dtype=np.int64)
    notes.append(
        f"kaminpar {kaminpar.__version__}: k-way, {threads} threads, nodes balanced to "
        f"eps {KAMINPAR_EPSILON}"
    )
    return owner


def assign_parts(
    graph: Graph,
    num_parts: int,
    method: str = "metis",
    seed: int = 0,
    notes: list[str] | None = None,
    metis: str = "auto",
) -> np.ndarray:
    """Choose the owner rank of every node.

    ``metis`` runs k-way METIS (pymetis) on the symmetrised graph without self-loops with three
    balance constraints per node: 1 (nodes), 1 if a training node (train nodes), in-degree
    (stored edges). When METIS rejects three constraints it retries with nodes + edges, and when
    the k-way result misses :data:`BALANCE_TOLERANCE` it tries recursive bisection; both are
    logged and added to ``notes``. ``kaminpar`` runs KaMinPar (the ``kaminpar`` package, its
    default context, ``seed``, one thread per core) k-way into P parts on the same symmetrised
    graph, balancing nodes only (every part at most ``1 + KAMINPAR_EPSILON`` times ``ceil(N/P)``
    nodes; training nodes and edges are not constrained; with several threads the parts may
    differ between runs of the same seed). ``random`` deals a seeded permutation round-robin
    (node counts equal to within one); ``contiguous`` gives rank ``r`` the id range
    ``[r*N/P, (r+1)*N/P)``.

    Args:
        graph: the graph to split.
        num_parts: number of parts P, ``1 <= P <= graph.num_nodes``.
        method: one of :data:`METHODS`.
        seed: seed of METIS or of the random permutation.
        notes: if given, the METIS library used and messages about fallbacks are appended.
        metis: METIS library, one of :data:`METIS_LIBRARIES`: ``auto`` (a 32-bit ``libmetis``
            when one is installed and the graph fits its indices, else pymetis), ``libmetis``
            or ``pymetis``. Both run METIS's algorithm; partitions differ between libraries.

    Returns:
        int64 [num_nodes], owner rank of every node in ``[0, P)``.

    Raises:
        ConfigError: bad ``num_parts``, unknown ``method`` or ``metis``, ``libmetis`` asked
            for but not installed, or ``kaminpar`` not installed or failing.
    """
    check_num_parts(num_parts, graph.num_nodes)
    if method not in METHODS:
        raise ConfigError(f"unknown partition method {method!r} (choose from {', '.join(METHODS)})")
    if metis not in METIS_LIBRARIES:
        raise ConfigError(
            f"unknown METIS library {metis!r} (choose from {', '.join(METIS_LIBRARIES)})"
        )
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
    if method == "kaminpar":
        return _kaminpar(graph, num_parts, seed, notes)
    return _metis(graph, num_parts, seed, metis, notes)
