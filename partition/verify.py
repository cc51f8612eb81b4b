"""Checking a partition directory against its invariants and, optionally, the source graph."""

from __future__ import annotations

import os

import numpy as np
from tqdm import tqdm

from fullgraph.datasets.graph import GRAPH_ARRAYS, Graph
from fullgraph.datasets.link import LinkSplit
from fullgraph.errors import PartitionError
from fullgraph.partition.blocks import block_digest, node_blocks
from fullgraph.partition.cut_verify import check_cut_parts, recut
from fullgraph.partition.format import (
    BLOCK_ARRAYS,
    EDGE_ARRAYS,
    META_NAME,
    PART_ARRAYS,
    REWRITE,
    partition_root,
    read_meta,
)
from fullgraph.partition.link_verify import verify_link
from fullgraph.partition.load import Partition, load_partition
from fullgraph.resources import drop_resident_pages


def _fail(part: Partition, msg: str) -> PartitionError:
    return PartitionError(f"part-{part.rank}: {msg}")


def _check_structure(p: Partition, num_nodes: int, cut: bool = False) -> None:
    """Index ranges, offsets and shapes of one part (``cut``: a receptive-field cut, whose
    nodes store at most their whole-graph in-degree of edges)."""
    ni, nl, P = p.num_inner, p.num_local, p.num_parts
    if p.indptr.shape != (ni + 1,) or p.indptr[0] != 0 or np.any(np.diff(p.indptr) < 0):
        raise _fail(p, "indptr is not a CSR row pointer over the inner nodes")
    if p.indptr[-1] != p.indices.shape[0]:
        raise _fail(p, f"indptr ends at {int(p.indptr[-1])} but indices has {p.num_edges} entries")
    if p.indices.size and (p.indices.min() < 0 or p.indices.max() >= nl):
        raise _fail(p, f"a column index lies outside [0, {nl})")
    if p.global_ids.size and (p.global_ids.min() < 0 or p.global_ids.max() >= num_nodes):
        raise _fail(p, f"a global id lies outside [0, {num_nodes})")
    if np.unique(p.global_ids).size != nl:
        raise _fail(p, "global_ids holds a node twice")
    for name in ("x", "y", "train_mask", "val_mask", "test_mask"):
        if getattr(p, name).shape[0] != ni:
            raise _fail(p, f"{name} has {getattr(p, name).shape[0]} rows, expected {ni}")
    for name, total in (("recv_offsets", p.num_halo), ("send_offsets", p.send_index.shape[0])):
        off = getattr(p, name)
        if off.shape != (P + 1,) or off[0] != 0 or off[-1] != total or np.any(np.diff(off) < 0):
            raise _fail(p, f"{name} is not a list of P+1 offsets ending at {total}")
    if p.recv_offsets[p.rank + 1] != p.recv_offsets[p.rank] or p.send_to(p.rank).size:
        raise _fail(p, "exchanges rows with itself")
    if p.send_index.size and (p.send_index.min() < 0 or p.send_index.max() >= ni):
        raise _fail(p, "send_index names a node that is not inner")
    stored = np.diff(p.indptr)
    wrong = stored > p.in_degree[:ni] if cut else stored != p.in_degree[:ni]
    if np.any(wrong):
        v = int(p.global_ids[np.flatnonzero(wrong)[0]])
        raise _fail(p, f"node {v} stores a different number of incoming edges than its in-degree")
    _check_edge_values(p)
    halo_used = np.bincount(p.indices[p.indices >= ni] - ni, minlength=p.num_halo)
    if np.any(halo_used == 0):
        v = int(p.global_ids[ni + np.flatnonzero(halo_used == 0)[0]])
        raise _fail(p, f"halo node {v} is the source of no stored edge")


def _check_edge_values(p: Partition) -> None:
    """Per-edge arrays: present as ``meta.json`` says, one entry per stored edge, finite, and
    the inner nodes' ``in_weight`` the sum of their stored edge weights."""
    ni = p.num_inner
    for name, want in (
        ("edge_weight", p.meta.get("edge_weight", False)),
        ("in_weight", p.meta.get("edge_weight", False)),
        ("edge_attr", p.meta.get("edge_dim", 0) > 0),
    ):
        if (getattr(p, name) is not None) != bool(want):
            raise _fail(p, f"{name} is {'missing' if want else 'stored'} but meta.json says not")
    if p.edge_weight is not None:
        if p.edge_weight.shape != (p.num_edges,):
            raise _fail(p, f"edge_weight has {p.edge_weight.shape[0]} entries, not one per edge")
        if not np.isfinite(p.edge_weight).all():
            raise _fail(p, "edge_weight holds NaN or infinite values")
        rows = np.repeat(np.arange(ni), np.diff(p.indptr))
        sums = np.bincount(rows, weights=p.edge_weight.astype(np.float64), minlength=ni)
        bad = np.flatnonzero(~np.isclose(sums, p.in_weight[:ni], rtol=1e-12, atol=0))
        if bad.size:
            v = int(p.global_ids[bad[0]])
            raise _fail(p, f"in_weight of node {v} is not the sum of its stored edge weights")
    if p.edge_attr is not None:
        if p.edge_attr.shape != (p.num_edges, p.meta["edge_dim"]):
            raise _fail(p, f"edge_attr has shape {p.edge_attr.shape}, not [edges, edge_dim]")
        if not np.isfinite(p.edge_attr).all():
            raise _fail(p, "edge_attr holds NaN or infinite values")


#: Stored edges compared per block of rows (bounds the temporaries of a products-size part).
EDGE_BLOCK = 1 << 22


def _row_blocks(indptr: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive row ranges ``[lo, hi)`` of about ``limit`` entries each (at least a row)."""
    rows = indptr.shape[0] - 1
    cuts = np.searchsorted(indptr, np.arange(limit, int(indptr[-1]), limit), side="right") - 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 1, rows), [rows]]))
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _check_against_graph(p: Partition, graph: Graph) -> None:
    """Edges, degrees, features, labels and masks of one part against the source graph, a
    block of rows at a time."""
    n, ni = graph.num_nodes, p.num_inner
    inner = np.asarray(p.global_ids[:ni])
    if not np.array_equal(p.in_degree, graph.in_degree()[p.global_ids]):
        raise _fail(p, "in_degree differs from the source graph's in-degrees")
    in_weight = graph.in_weight()
    if in_weight is not None and not np.array_equal(p.in_weight, in_weight[p.global_ids]):
        raise _fail(p, "in_weight differs from the source graph's weighted in-degrees")
    indptr = np.asarray(p.indptr)
    x = np.zeros((n, 0), np.float32) if graph.x is None else graph.x
    sources = (
        ("x", x),
        ("y", graph.y),
        ("train_mask", graph.train_mask),
        ("val_mask", graph.val_mask),
        ("test_mask", graph.test_mask),
    )
    for lo, hi in _row_blocks(indptr, EDGE_BLOCK):
        counts = np.diff(indptr[lo : hi + 1])
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), counts)
        starts = np.repeat(graph.indptr[inner[lo:hi]] - indptr[lo:hi], counts)
        at = starts + np.arange(indptr[lo], indptr[hi], dtype=np.int64)
        expected = rows * n + graph.indices[at]
        stored = rows * n + p.global_ids[p.indices[indptr[lo] : indptr[hi]]]
        want_order = np.argsort(expected, kind="stable")
        got_order = np.argsort(stored, kind="stable")
        expected, stored = expected[want_order], stored[got_order]
        if not np.array_equal(expected, stored):
            row = int(expected[np.flatnonzero(expected != stored)[0]] // n)
            raise _fail(p, f"incoming edges of node {int(inner[row])} differ from the source graph")
        for name in ("edge_weight", "edge_attr"):
            values = getattr(graph, name)
            if values is None:
                continue
            got = getattr(p, name)[indptr[lo] : indptr[hi]][got_order]
            want = np.asarray(values[at])[want_order]
            if not np.array_equal(got, want):
                e = np.flatnonzero(np.any((got != want).reshape(got.shape[0], -1), axis=1))[0]
                row = int(expected[e] // n)
                raise _fail(
                    p,
                    f"{name} of an incoming edge of node {int(inner[row])} (from node "
                    f"{int(expected[e] % n)}) differs from the source graph (values changed or "
                    f"not aligned with indices)",
                )
        for name, src in sources:
            got, want = getattr(p, name)[lo:hi], src[inner[lo:hi]]
            if not np.array_equal(got, want):
                bad = np.flatnonzero(np.any((got != want).reshape(hi - lo, -1), axis=1))
                raise _fail(
                    p, f"{name} of node {int(inner[lo + bad[0]])} differs from the source graph"
                )


def _stored_blocks(parts: list[Partition], num_nodes: int, num_blocks: int) -> np.ndarray:
    """The block of every node as the parts store it, checked: every block wholly inside one
    part, every node in one block, rows ascending by global id within a block.

    Returns:
        int64 [num_nodes].

    Raises:
        PartitionError: the first problem, naming the part, the block and the node.
    """
    block_of = np.full(num_nodes, -1, dtype=np.int64)
    holder = np.full(num_blocks, -1, dtype=np.int64)
    for p in parts:
        if p.block_ids is None or p.block_ptr is None or p.block_rows is None:
            raise _fail(p, "has no block arrays but meta.json records num_blocks")
        ids = np.asarray(p.block_ids)
        twice = ids[holder[ids] >= 0]
        if twice.size:
            b = int(twice[0])
            raise _fail(p, f"block {b} is in part-{int(holder[b])} too: a block lies in one part")
        holder[ids] = p.rank
        sizes = np.diff(p.block_ptr)
        gids = np.asarray(p.global_ids[: p.num_inner])[p.block_rows]
        step = np.diff(gids)
        within = np.ones(step.size, dtype=bool)
        within[p.block_ptr[1:-1] - 1] = False  # where one block ends and the next begins
        bad = np.flatnonzero(within & (step <= 0))
        if bad.size:
            k = int(np.searchsorted(p.block_ptr, bad[0], side="right") - 1)
            raise _fail(
                p,
                f"the rows of block {int(ids[k])} are not in ascending global id (node "
                f"{int(gids[bad[0] + 1])} after {int(gids[bad[0]])})",
            )
        block_of[gids] = np.repeat(ids, sizes)
    missing = np.flatnonzero(holder < 0)
    if missing.size:
        raise PartitionError(f"block {int(missing[0])} of {num_blocks} is in no part; {REWRITE}")
    if np.any(block_of < 0):
        raise PartitionError(f"node {int(np.flatnonzero(block_of < 0)[0])} is in no block")
    return block_of


def _check_blocks(
    parts: list[Partition], meta: dict, graph: Graph | None, expected: np.ndarray | None = None
) -> bool:
    """The blocks of a partition with blocks against ``meta.json``'s digest and, with
    ``graph``, against the blocks cut from it again (``expected``: those of a cut made again);
    whether they were cut again (not when the METIS library that cut them is not installed
    here).

    Raises:
        PartitionError: one line saying what differs.
    """
    n, nb = int(meta["num_nodes"]), int(meta["num_blocks"])
    stored = _stored_blocks(parts, n, nb)
    if block_digest(stored) != meta["block_sha256"]:
        raise PartitionError(
            f"the parts' blocks differ from the block_sha256 of {META_NAME} (a block_ids or "
            f"block_ptr file was changed); {REWRITE}"
        )
    if graph is None:
        return False
    if expected is not None:
        if not np.array_equal(expected, stored):
            v = int(np.flatnonzero(expected != stored)[0])
            raise PartitionError(
                f"the blocks of the cut made again from {graph.name} differ from the stored "
                f"ones (node {v}); {REWRITE}"
            )
        return True
    library = meta["block_metis"]
    if library == "libmetis":
        from fullgraph.partition.libmetis import find_libmetis

        if find_libmetis() is None:
            return False
    again = node_blocks(
        graph,
        int(meta["block_size"]),
        int(meta["block_seed"]),
        library if library in ("libmetis", "pymetis", "rcm") else "auto",
    )
    if again.num_blocks != nb or not np.array_equal(again.block, stored):
        diff = np.flatnonzero(again.block != stored) if again.num_blocks == nb else [0]
        v = int(diff[0])
        raise PartitionError(
            f"the blocks cut again from {graph.name} ({again.num_blocks} blocks of size "
            f"{again.block_size}, seed {again.seed}, {library}) differ from the stored "
            f"{nb} (node {v}: block {int(stored[v])} stored, {int(again.block[v])} cut again); "
            f"{REWRITE}"
        )
    return True


def _release(obj: Partition | Graph) -> None:
    """Drop the resident pages of ``obj``'s memory-mapped arrays (they stay in the page cache;
    in-memory arrays are left alone), so verifying P parts holds about one part at a time."""
    names = (
        (*PART_ARRAYS, *EDGE_ARRAYS, *BLOCK_ARRAYS) if isinstance(obj, Partition) else GRAPH_ARRAYS
    )
    for name in names:
        drop_resident_pages(getattr(obj, name, None))
    for array in (getattr(obj, "link", None) or {}).values():
        drop_resident_pages(array)


def verify_partitions(
    path: str | os.PathLike[str], graph: Graph | None = None, link: LinkSplit | None = None
) -> dict:
    """Check every invariant of the partition directory ``path``.

    Checks: every field of ``meta.json`` against the arrays (counts per part and in total,
    ``num_features``, ``num_classes``, ``num_train_global``, ``edge_cut``); split masks
    disjoint; checksums and sizes of all files; every node owned by exactly one part; CSR and
    offsets well formed; halo nodes grouped by their true owner and each used by an edge; every
    inner node stores exactly its in-degree of incoming edges and the edge counts add up; send
    lists of ``r`` to ``q`` equal ``q``'s halo rows from ``r``; with blocks, every node in one
    block, every block wholly inside one part, rows ascending by global id within a block and
    the block vector's SHA-256 that of ``meta.json``. With ``graph``: sizes, every incoming edge
    (as a multiset per node), in-degrees, features, labels and masks equal the source, and the
    blocks cut again from it (same block size, seed and METIS library, where that library is
    installed) equal the stored ones. With ``meta.json["link"]``: every supervision edge once
    over the parts at its anchor's owner, the arrays' digest, no held-out positive in the
    message-passing graph (:func:`~fullgraph.partition.link_verify.verify_link`); with ``link``,
    also that the parts hold that split.

    Args:
        path: the partition directory (or its ``meta.json``).
        graph: the source graph, or ``None`` to check internal consistency only.
        link: the source link split (with ``graph``), or ``None``.

    Returns:
        A summary dict (``num_parts``, ``num_nodes``, ``num_edges``, ``total_halo_rows``,
        ``files_checked``, ``against_graph``, ``num_blocks`` (``None`` without blocks),
        ``blocks_cut_again``, ``link``: :func:`~fullgraph.partition.link_verify.verify_link`'s
        summary, ``None`` without a link split).

    Raises:
        PartitionError: the first problem found, naming the part and the node.
    """
    root = partition_root(path)
    meta_path = root / META_NAME
    meta, _ = read_meta(root)
    n, P = int(meta["num_nodes"]), int(meta["num_parts"])
    if link is not None and "link" not in meta:
        raise PartitionError(
            f"{meta_path} has no link split but {link.name}'s was given; partition the dataset "
            f"again (its link split is carried when it has one)"
        )
    cut_blocks = None
    if graph is not None and "cut" in meta:  # checked against the cut made again
        graph, cut_blocks = recut(meta, graph)
    if graph is not None:
        for key, value in (
            ("num_nodes", graph.num_nodes),
            ("num_edges", graph.num_edges),
            ("num_features", graph.num_features),
            ("num_classes", graph.num_classes),
            ("edge_weight", graph.edge_weight is not None),
            ("edge_dim", graph.edge_dim),
        ):
            recorded = meta.get(key, {"edge_weight": False, "edge_dim": 0}.get(key))
            if recorded != value:
                raise PartitionError(
                    f"{meta_path}: {key} is {recorded} but the graph {graph.name} has {value}"
                )
    parts = [load_partition(root, r) for r in tqdm(range(P), desc="verify", disable=None)]
    owner = np.full(n, -1, dtype=np.int64)
    cut = 0
    for p in parts:
        _check_structure(p, n, cut="cut" in meta)
        inner = p.global_ids[: p.num_inner]
        if np.any(owner[inner] >= 0):
            v = int(inner[np.flatnonzero(owner[inner] >= 0)[0]])
            raise PartitionError(f"node {v} is owned by part {owner[v]} and part {p.rank}")
        owner[inner] = p.rank
        cut += int(np.count_nonzero(p.indices >= p.num_inner))
        _release(p)  # parts are read one at a time: only one part's pages stay resident
    if np.any(owner < 0):
        raise PartitionError(f"node {int(np.flatnonzero(owner < 0)[0])} is owned by no part")
    total_edges = sum(p.num_edges for p in parts)
    if total_edges != meta["num_edges"]:
        raise PartitionError(
            f"parts store {total_edges} edges, meta.json records {meta['num_edges']}"
        )
    if sum(int(p.train_mask.sum()) for p in parts) != meta["num_train_global"]:
        raise PartitionError("training nodes of the parts do not add up to num_train_global")
    global_degree = np.zeros(n, dtype=np.int64)
    global_weight = np.zeros(n, dtype=np.float64)
    for p in parts:
        global_degree[p.global_ids[: p.num_inner]] = p.in_degree[: p.num_inner]
        if p.in_weight is not None:
            global_weight[p.global_ids[: p.num_inner]] = p.in_weight[: p.num_inner]
    for p in parts:
        halo = p.global_ids[p.num_inner :]
        group = np.repeat(np.arange(P), np.diff(p.recv_offsets))
        if not np.array_equal(owner[halo], group):
            raise _fail(p, "halo rows are not grouped by their owner rank")
        if not np.array_equal(p.in_degree[p.num_inner :], global_degree[halo]):
            raise _fail(p, "in_degree of a halo node differs from its owner's")
        if p.in_weight is not None and not np.array_equal(
            p.in_weight[p.num_inner :], global_weight[halo]
        ):
            raise _fail(p, "in_weight of a halo node differs from its owner's")
        for q in parts:
            sent = parts[q.rank].global_ids[q.send_to(p.rank)]
            if not np.array_equal(sent, halo[p.recv_offsets[q.rank] : p.recv_offsets[q.rank + 1]]):
                raise PartitionError(
                    f"part-{q.rank} sends part-{p.rank} other rows than part-{p.rank} expects"
                )
        if graph is not None:
            _check_against_graph(p, graph)
            _release(graph)
        _release(p)
    if "cut" in meta:
        check_cut_parts(parts, meta)
    recomputed = False
    if "num_blocks" in meta:
        recomputed = _check_blocks(parts, meta, graph, cut_blocks)
    if cut != meta["edge_cut"]:
        raise PartitionError(
            f"{meta_path}: edge_cut is {meta['edge_cut']} but the parts store {cut} edges from "
            f"nodes of other parts; {REWRITE}"
        )
    link_summary = None if "link" not in meta else verify_link(parts, meta, owner, link)
    if graph is None:  # with the graph, num_classes was compared with the graph's above
        top = max((int(p.y.max()) for p in parts if p.y.size), default=-1)
        if top >= 0 and meta["num_classes"] != top + 1:
            raise PartitionError(
                f"{meta_path}: num_classes is {meta['num_classes']} but the largest label in "
                f"any part is {top} (expected {top + 1}; if the source graph really has empty "
                f"classes, verify against it with --root); {REWRITE}"
            )
    return {
        "path": str(path),
        "num_parts": P,
        "num_nodes": n,
        "num_edges": total_edges,
        "total_halo_rows": sum(p.num_halo for p in parts),
        "files_checked": len(meta["files"]),
        "against_graph": graph is not None,
        "num_blocks": meta.get("num_blocks"),
        "blocks_cut_again": recomputed,
        "link": link_summary,
    }
