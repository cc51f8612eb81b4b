"""Fixed node blocks chosen before the number of parts, and parts as contiguous runs of them.

Bit-identical training at any rank count (issue 33): the node axis is cut into blocks once,
every part a union of whole blocks, and sums over nodes added per block, then in one fixed tree.

:func:`node_blocks` is that blocking: a function of the graph, the seed, the block size and the
METIS library only, never of P. METIS's recursive bisection first cuts the graph into a few top
parts (a power of two up to 32) balancing nodes, training nodes and edges, as k-way
:func:`~fullgraph.partition.assign.assign_parts` does (nodes alone where training nodes are
plentiful: they follow, and the cut is smaller), then each top part into blocks of about
``B`` nodes (nodes only: training nodes are too few to balance per block; Cora's 140 over 271
blocks left a third of METIS's parts empty). Block indices follow the tree of bisections, so a
run of consecutive block indices is a well-connected subgraph, and at P = 2, 4, 8 the runs are
whole subtrees. :func:`parts_from_blocks` then cuts the block sequence into P contiguous runs
that minimise the largest part's share of nodes, training nodes and edges.

Default block size (:func:`default_block_size`): ``B = clamp(N // 256, min(64, N // 32),
4096)``: at least 256 blocks (32 per part at P = 8) from 16,384 nodes, blocks of 64 nodes (at
least 32 blocks) below (a block costs a Python call per product: 10 rows do not pay for it),
at most 4096 rows a block (beyond about a million nodes the count grows instead, ``N / 4096``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numba
import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.errors import ConfigError, PartitionError
from fullgraph.partition.assign import METIS_LIBRARIES, metis_library, symmetric_adjacency
from fullgraph.partition.block_cache import BLOCK_CACHE, CachedBlocks
from fullgraph.partition.rcm import rcm_blocks

#: The cut without METIS (:func:`node_blocks` ``metis="rcm"``, and ``auto``'s fallback).
RCM = "rcm"
#: What :func:`node_blocks` accepts: a METIS library, or :data:`RCM`.
BLOCK_LIBRARIES = (*METIS_LIBRARIES, RCM)

#: A graph of at least this many nodes is cut into at least this many blocks (32 per part at P=8).
MIN_BLOCKS = 256

#: The fewest nodes a default block holds, and the fewest default blocks of a small graph.
MIN_BLOCK_ROWS, MIN_SMALL_BLOCKS = 64, 32
#: The most nodes a block is meant to hold (METIS's target; it may exceed it by its tolerance).
MAX_BLOCK_ROWS = 4096

#: At most this many top parts (a power of two) balance training nodes and edges too.
MAX_TOP_PARTS = 32

#: A top part holds at least this many training nodes and this many blocks.
TOP_PART_LEAST = 8

#: With at least this many training nodes a block (on average), the top parts balance nodes
#: alone (training nodes and edges follow, and METIS cuts less); with fewer, all three.
TRAIN_PER_BLOCK = 8


def default_block_size(num_nodes: int) -> int:
    """The block size of ``num_nodes`` nodes: ``clamp(N // 256, min(64, N // 32), 4096)``."""
    floor = min(MIN_BLOCK_ROWS, max(1, num_nodes // MIN_SMALL_BLOCKS))
    return int(min(MAX_BLOCK_ROWS, max(floor, num_nodes // MIN_BLOCKS)))


@dataclass(frozen=True)
class NodeBlocks:
    """The blocks of a graph's nodes, numbered so that runs of block indices are connected.

    Attributes:
        block: int64 [num_nodes], the block of every node, in ``[0, num_blocks)``; no block is
            empty.
        num_blocks: number of blocks.
        block_size: the target size ``B`` the blocks were cut with.
        seed: METIS's seed.
        metis: the METIS library that cut the blocks (``libmetis``, ``pymetis``, or ``none``
            when every node is its own block).
        position, full_rows: a receptive-field cut's blocks (:mod:`~fullgraph.partition.
            receptive_cut`): every node's position in its block of the whole graph, and every
            block's size there; ``None`` otherwise.
    """

    block: np.ndarray
    num_blocks: int
    block_size: int
    seed: int
    metis: str
    position: np.ndarray | None = None
    full_rows: np.ndarray | None = None

    def digest(self) -> str:
        """Hex SHA-256 of the block vector as little-endian int64 (what ``meta.json`` keeps)."""
        return block_digest(self.block)

    def sizes(self) -> np.ndarray:
        """int64 [num_blocks], the number of nodes in every block."""
        return np.bincount(self.block, minlength=self.num_blocks).astype(np.int64)


def block_digest(block: np.ndarray) -> str:
    """Hex SHA-256 of a block vector (int64 [num_nodes]) as little-endian int64 bytes."""
    data = np.ascontiguousarray(block, dtype="<i8")
    return hashlib.sha256(data.view(np.uint8)).hexdigest()


def check_block_size(block_size: object, num_nodes: int) -> int:
    """``block_size`` checked to be an integer in ``[1, num_nodes]``.

    Raises:
        ConfigError: one line naming the value.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise ConfigError(f"block size must be an integer, got {block_size!r}")
    if not 1 <= block_size <= num_nodes:
        raise ConfigError(f"block size must lie in [1, {num_nodes}] (the nodes), got {block_size}")
    return int(block_size)


@numba.njit(cache=True, nogil=True)
def _induced(xadj, adjncy, nodes, local):  # pragma: no cover - compiled by numba
    """CSR of the subgraph induced by ``nodes`` (``local[v]`` its local id, -1 outside)."""
    m = nodes.shape[0]
    sub_xadj = np.zeros(m + 1, dtype=np.int64)
    for i in range(m):
        v = nodes[i]
        c = 0
        for e in range(xadj[v], xadj[v + 1]):
            if local[adjncy[e]] >= 0:
                c += 1
        sub_xadj[i + 1] = sub_xadj[i] + c
    sub_adjncy = np.empty(sub_xadj[m], dtype=np.int64)
    k = 0
    for i in range(m):
        v = nodes[i]
        for e in range(xadj[v], xadj[v + 1]):
            u = local[adjncy[e]]
            if u >= 0:
                sub_adjncy[k] = u
                k += 1
    return sub_xadj, sub_adjncy


def _recursive_bisection(
    library: str, xadj: np.ndarray, adjncy: np.ndarray, nparts: int, seed: int
) -> np.ndarray:
    """METIS's recursive bisection of a (sub)graph into ``nparts`` parts of equal node counts;
    its part ids follow the bisection tree (the first ``nparts // 2`` ids on one side)."""
    n = int(xadj.shape[0] - 1)
    if nparts == 1:
        return np.zeros(n, dtype=np.int64)
    if nparts >= n:  # as many parts as nodes: each node its own
        return np.arange(n, dtype=np.int64)
    try:
        if library == "libmetis":
            import fullgraph.partition.libmetis as libmetis

            lib = libmetis.require_libmetis()
            x, a = libmetis.as_idx(xadj, lib.idx), libmetis.as_idx(adjncy, lib.idx)
            w = np.ones(n, dtype=lib.idx)
            return libmetis.part_graph(lib, nparts, x, a, w, 1, int(seed), True)
        import pymetis

        adjacency = pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy)
        result = pymetis.part_graph(
            nparts, adjacency, recursive=True, options=pymetis.Options(seed=int(seed))
        )
        return np.asarray(result.vertex_part, dtype=np.int64)
    except Exception as exc:  # METIS reports failures as RuntimeError or MemoryError
        raise PartitionError(f"METIS failed to cut a subgraph into {nparts} blocks: {exc}") from exc


def _top_parts(graph: Graph, target: int) -> int:
    """How many top parts (a power of two) balance training nodes and edges besides nodes: at
    most :data:`MAX_TOP_PARTS`, each with at least :data:`TOP_PART_LEAST` blocks and training
    nodes."""
    train = int(graph.train_mask.sum())
    limit = min(MAX_TOP_PARTS, target // TOP_PART_LEAST, train // TOP_PART_LEAST)
    k = 1
    while 2 * k <= limit:
        k *= 2
    return k


def _block_count(graph: Graph, block_size: int) -> tuple[int, int]:
    """``(blocks asked of METIS, top parts)``: ``ceil(N / B)`` rounded up to a multiple of the
    top parts (:func:`_top_parts`)."""
    target = math.ceil(graph.num_nodes / block_size)
    top = _top_parts(graph, target)
    return top * math.ceil(target / top), top


def node_blocks(
    graph: Graph,
    block_size: int | None = None,
    seed: int = 0,
    metis: str = "auto",
    notes: list[str] | None = None,
) -> NodeBlocks:
    """The blocks of ``graph``'s nodes, numbered along a tree of METIS bisections.

    First the graph is cut into ``K`` top parts (a power of two, :func:`_top_parts`) by
    METIS's recursive bisection balancing nodes, training nodes and edges (what k-way
    :func:`~fullgraph.partition.assign.assign_parts` balances; nodes alone when there are
    :data:`TRAIN_PER_BLOCK` training nodes a block or more), then every top part by
    recursive bisection into ``ceil(ceil(N / B) / K)`` blocks of equal node counts. Block
    indices follow the bisection tree (top part after top part), so a run of consecutive
    blocks is a well-connected subgraph, and at P a divisor of ``K`` the runs are the top
    parts themselves. A deterministic function of the graph (its CSR and training mask),
    ``block_size``, ``seed`` and the METIS library; never of the number of parts.

    Args:
        graph: the graph.
        block_size: target nodes per block ``B`` (default :func:`default_block_size`).
        seed: METIS's seed.
        metis: METIS library (:data:`~fullgraph.partition.assign.METIS_LIBRARIES`), or
            ``rcm`` (:mod:`~fullgraph.partition.rcm`; ``auto``'s fallback without METIS).
        notes: if given, the METIS library used and its fallbacks are appended.

    Returns:
        The :class:`NodeBlocks` (METIS's empty parts dropped). The process keeps the blocks of
        its last few inputs (:data:`~fullgraph.partition.block_cache.BLOCK_CACHE`): the same
        input again gets a copy of them, and the same notes, without METIS.

    Raises:
        ConfigError: a bad block size or METIS library.
        PartitionError: METIS failed.
    """
    n = graph.num_nodes
    size = default_block_size(n) if block_size is None else check_block_size(block_size, n)
    if metis not in BLOCK_LIBRARIES:
        raise ConfigError(
            f"unknown METIS library {metis!r} (choose from {', '.join(BLOCK_LIBRARIES)})"
        )
    notes = [] if notes is None else notes
    if _block_count(graph, size)[0] == 1:
        return NodeBlocks(np.zeros(n, dtype=np.int64), 1, size, int(seed), "none")
    key = BLOCK_CACHE.key(graph, size, seed, metis)
    kept = BLOCK_CACHE.get(key)
    if kept is not None:
        notes.extend(kept.notes)
        return NodeBlocks(kept.block.copy(), kept.num_blocks, size, int(seed), kept.metis)
    first = len(notes)
    blocks = _cut_blocks(graph, size, seed, metis, notes)
    cut_notes = tuple(notes[first:])
    BLOCK_CACHE.put(key, CachedBlocks(blocks.block, blocks.num_blocks, blocks.metis, cut_notes))
    return blocks


def _cut_blocks(graph: Graph, size: int, seed: int, metis: str, notes: list[str]) -> NodeBlocks:
    """:func:`node_blocks` itself (arguments checked, more than one block)."""
    n = graph.num_nodes
    target, top = _block_count(graph, size)
    leaves = target // top
    if metis == RCM:
        return _rcm(graph, size, target, seed)
    try:
        call, library = metis_library(graph, top, metis, notes)
    except ImportError as exc:  # neither libmetis nor pymetis on this machine
        if metis != "auto":
            raise
        notes.append(
            f"metis: none importable ({exc}): blocks along a reverse Cuthill-McKee order "
            f"(scipy; a worse cut than METIS's, the same at any rank count)"
        )
        return _rcm(graph, size, target, seed)
    if top > 1:
        weights = block_loads(graph, np.arange(n, dtype=np.int64), n)
        if int(graph.train_mask.sum()) >= TRAIN_PER_BLOCK * target:  # they follow the nodes
            weights = {"nodes": weights["nodes"]}
        vweights = np.ascontiguousarray(np.stack(list(weights.values()), axis=1).ravel())
        try:
            owner = call(vweights, len(weights), int(seed), True)
        except Exception as exc:  # METIS reports failures as RuntimeError or MemoryError
            raise PartitionError(
                f"METIS failed to cut {graph.name} into {top} parts: {exc}"
            ) from exc
        del vweights, weights
    else:
        owner = np.zeros(n, dtype=np.int64)
    del call
    xadj, adjncy = symmetric_adjacency(graph)
    local = np.full(n, -1, dtype=np.int64)
    fine = np.empty(n, dtype=np.int64)
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(top + 1))
    for t in range(top):
        nodes = order[bounds[t] : bounds[t + 1]]
        local[nodes] = np.arange(nodes.size, dtype=np.int64)
        sub_xadj, sub_adjncy = _induced(xadj, adjncy, nodes, local)
        local[nodes] = -1
        fine[nodes] = t * leaves + _recursive_bisection(library, sub_xadj, sub_adjncy, leaves, seed)
        del sub_xadj, sub_adjncy
    counts = np.bincount(fine, minlength=top * leaves)
    renumber = np.cumsum(counts > 0) - 1  # empty METIS parts dropped
    block = renumber[fine].astype(np.int64)
    return NodeBlocks(block, int(np.count_nonzero(counts)), size, int(seed), library)


def _rcm(graph: Graph, size: int, target: int, seed: int) -> NodeBlocks:
    """:func:`~fullgraph.partition.rcm.rcm_blocks` as :class:`NodeBlocks`."""
    block = rcm_blocks(graph, target)
    return NodeBlocks(block, int(block.max()) + 1, size, int(seed), RCM)


def block_loads(graph: Graph, block: np.ndarray, num_blocks: int) -> dict[str, np.ndarray]:
    """What :func:`parts_from_blocks` balances, per block: ``nodes``, ``train`` (training
    nodes) and ``edges`` (stored incoming edges), as the k-way METIS of
    :func:`~fullgraph.partition.assign.assign_parts` does; a quantity the graph has none of is
    left out.

    Returns:
        name -> int64 [num_blocks].
    """
    loads = {
        "nodes": np.bincount(block, minlength=num_blocks),
        "train": np.bincount(block, weights=graph.train_mask, minlength=num_blocks),
        "edges": np.bincount(block, weights=np.diff(graph.indptr), minlength=num_blocks),
    }
    return {k: v.astype(np.int64) for k, v in loads.items() if v.sum() > 0}


@numba.njit(cache=True, nogil=True)
def _greedy_runs(loads, limit, num_parts, starts):  # pragma: no cover - compiled by numba
    """Cut ``loads`` (float64 [blocks, constraints]) greedily into runs whose every column sums
    to at most ``limit``; the start of every run after the first goes to ``starts``. Returns
    the runs used, or ``num_parts + 1`` when ``num_parts`` runs are not enough."""
    nb, nc = loads.shape
    acc = np.zeros(nc)
    runs = 1
    for b in range(nb):
        over = False
        for c in range(nc):
            if loads[b, c] > limit:
                return num_parts + 1
            if acc[c] + loads[b, c] > limit:
                over = True
        if over:
            if runs == num_parts:
                return num_parts + 1
            starts[runs - 1] = b
            runs += 1
            for c in range(nc):
                acc[c] = loads[b, c]
        else:
            for c in range(nc):
                acc[c] += loads[b, c]
    return runs


def _run_cost(share: np.ndarray, lo: int, hi: int) -> float:
    """The largest constraint share of the run of blocks ``[lo, hi)``."""
    return float(share[lo:hi].sum(axis=0).max())


def parts_from_blocks(loads: dict[str, np.ndarray] | np.ndarray, num_parts: int) -> np.ndarray:
    """Cut the block sequence into ``num_parts`` contiguous runs, as balanced as runs can be.

    The runs minimise the largest part's share (over the mean share) of every balanced
    quantity at once: a bisection on that bound, each bound tried by a greedy cut (exact for
    runs); a part left empty is filled by splitting the heaviest run of two or more blocks.

    Args:
        loads: per block, each quantity to balance (:func:`block_loads`), or an array
            [num_blocks] / [num_blocks, k] of them.
        num_parts: P >= 1, at most the number of blocks.

    Returns:
        int64 [num_blocks], the part of every block: non-decreasing, every part non-empty.

    Raises:
        ConfigError: ``num_parts`` is not an integer in ``[1, num_blocks]``.
    """
    columns = list(loads.values()) if isinstance(loads, dict) else [np.asarray(loads)]
    w = np.column_stack(columns).astype(np.float64) if columns else np.zeros((0, 1))
    nb = int(w.shape[0])
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise ConfigError(f"number of parts must be an integer, got {num_parts!r}")
    if num_parts < 1:
        raise ConfigError(f"number of parts must be at least 1, got {num_parts}")
    if num_parts > nb:
        raise ConfigError(
            f"cannot cut {nb} blocks into {num_parts} parts (P > number of blocks); give a "
            f"smaller --block-size, or --assign kway"
        )
    totals = w.sum(axis=0)
    w = w[:, totals > 0]
    if w.shape[1] == 0:
        w = np.ones((nb, 1))
    share = w / (w.sum(axis=0) / num_parts)  # 1.0 = a perfectly balanced part
    starts = np.zeros(max(num_parts - 1, 1), dtype=np.int64)
    lo, hi = max(1.0, float(share.max())), float(share.sum(axis=0).max()) * (1 + 1e-9)
    for _ in range(60):
        if hi - lo <= 1e-9 * hi:
            break
        mid = 0.5 * (lo + hi)
        if _greedy_runs(share, mid, num_parts, starts) <= num_parts:
            hi = mid
        else:
            lo = mid
    runs = int(_greedy_runs(share, hi, num_parts, starts))
    if runs > num_parts:  # cannot happen for hi >= the whole sum; kept as a guard
        raise PartitionError(f"internal: no cut of {nb} blocks into {num_parts} runs")
    bounds = [0, *starts[: runs - 1].tolist(), nb]
    while len(bounds) - 1 < num_parts:  # fewer runs than parts: split the heaviest long run
        spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b - a >= 2]
        a, b = max(spans, key=lambda r: _run_cost(share, *r))
        cut = min(
            range(a + 1, b), key=lambda c: max(_run_cost(share, a, c), _run_cost(share, c, b))
        )
        bounds = sorted({*bounds, cut})
    part = np.zeros(nb, dtype=np.int64)
    for start in bounds[1:-1]:
        part[start:] += 1
    return part


def block_assignment(
    graph: Graph,
    num_parts: int,
    seed: int = 0,
    metis: str = "auto",
    block_size: int | None = None,
    notes: list[str] | None = None,
) -> tuple[np.ndarray, NodeBlocks]:
    """The owner of every node when the parts are contiguous runs of :func:`node_blocks`.

    Args:
        graph: the graph to split.
        num_parts: P, at most the number of blocks.
        seed: METIS's seed (the blocks depend on it, never on P).
        metis: METIS library of the blocks (see :func:`node_blocks`).
        block_size: target nodes per block (default :func:`default_block_size`).
        notes: if given, the METIS library used, its fallbacks and a line on the blocks are
            appended.

    Returns:
        ``(owner, blocks)``: int64 [num_nodes] owner of every node in ``[0, P)``, and the
        blocks.

    Raises:
        ConfigError: P larger than the number of blocks (refused before METIS runs when it
            exceeds ``ceil(N / block_size)``), a bad block size or METIS library.
    """
    n = graph.num_nodes
    size = default_block_size(n) if block_size is None else check_block_size(block_size, n)
    most = _block_count(graph, size)[0]  # the blocks METIS is asked for (it may leave some empty)
    if isinstance(num_parts, (int, np.integer)) and num_parts > most:
        parts_from_blocks(np.ones(most), num_parts)  # the one-line refusal, before METIS runs
    notes = [] if notes is None else notes
    if not graph.train_mask.any():
        notes.append("blocks: graph has no training nodes; balancing nodes and edges only")
    blocks = node_blocks(graph, size, seed, metis, notes)
    part = parts_from_blocks(block_loads(graph, blocks.block, blocks.num_blocks), num_parts)
    notes.append(
        f"blocks: {blocks.num_blocks} blocks of about {blocks.block_size} nodes (largest "
        f"{int(blocks.sizes().max())}); the parts hold blocks "
        + ", ".join(f"{int(a)}-{int(b)}" for a, b in _runs(part))
    )
    return part[blocks.block], blocks


def _runs(part: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` block index of every part of a non-decreasing ``part``."""
    starts = np.concatenate([[0], np.flatnonzero(np.diff(part)) + 1])
    ends = np.concatenate([starts[1:] - 1, [part.size - 1]])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def check_whole_blocks(blocks: NodeBlocks, owner: np.ndarray) -> None:
    """Refuse blocks of another graph or a block split between two parts.

    Raises:
        PartitionError: naming the first block split.
    """
    block = blocks.block
    if block.shape != owner.shape or (
        block.size and not 0 <= block.min() <= block.max() < blocks.num_blocks
    ):
        raise PartitionError(
            f"blocks must give every one of the {owner.size} nodes a block in "
            f"[0, {blocks.num_blocks})"
        )
    part_of = np.zeros(blocks.num_blocks, dtype=np.int64)
    part_of[block] = owner
    split = np.flatnonzero(part_of[block] != owner)
    if split.size:
        b = int(block[split[0]])
        raise PartitionError(
            f"block {b} lies in parts {int(part_of[b])} and {int(owner[split[0]])}: a part must "
            "hold whole blocks"
        )
