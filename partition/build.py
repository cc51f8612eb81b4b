"""Building per-rank parts from an owner array and writing them atomically.

The on-disk layout is described in :mod:`fullgraph.partition.format`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numba
import numpy as np
from tqdm import tqdm

from fullgraph.atomic import atomic_dir, atomic_write_json
from fullgraph.datasets.graph import SPLITS, Graph, first_overlap, split_name
from fullgraph.datasets.link import LinkSplit
from fullgraph.errors import ConfigError, DataError, PartitionError
from fullgraph.partition.assign import assign_parts, check_num_parts, resolve_assign
from fullgraph.partition.blocks import (
    NodeBlocks,
    block_assignment,
    check_whole_blocks,
)
from fullgraph.partition.format import (
    FORMAT_VERSION,
    META_NAME,
    part_dir_name,
)
from fullgraph.partition.link_parts import LinkParts, check_link_split
from fullgraph.partition.npy_files import ChunkedArray, save_array
from fullgraph.partition.output_kind import PARTITION, check_partition_out
from fullgraph.partition.part_blocks import part_block_arrays
from fullgraph.partition.receptive_cut import CutSpec, Rows, cut_and_assign
from fullgraph.partition.report import build_report
from fullgraph.resources import StageTimer, drop_resident_pages

#: Entries (edges or feature values) a part's builder holds at a time while streaming a file.
CHUNK_ELEMENTS = 1 << 24


@numba.njit(cache=True, nogil=True)
def _mark_foreign(indptr, indices, inner, owner, rank, mark):  # pragma: no cover - compiled
    """Set ``mark[u]`` for every source ``u`` of an edge into ``inner`` that ``rank`` does not
    own; return the number of such (cut) edges."""
    cut = 0
    for i in range(inner.shape[0]):
        v = inner[i]
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if owner[u] != rank:
                mark[u] = True
                cut += 1
    return cut


@numba.njit(cache=True, nogil=True)
def _local_sources(indptr, indices, rows, local, out):  # pragma: no cover - compiled by numba
    """``out`` = local ids (``local[u]``) of the sources of the incoming edges of ``rows``, row
    after row in CSR order."""
    k = 0
    for i in range(rows.shape[0]):
        v = rows[i]
        for e in range(indptr[v], indptr[v + 1]):
            out[k] = local[indices[e]]
            k += 1


def _edge_blocks(indptr: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive row ranges of a CSR with about :data:`CHUNK_ELEMENTS` entries each.

    Args:
        indptr: int64 row pointers [num_rows + 1].

    Returns:
        ``(lo, hi)`` row ranges covering every row once (one range ``(0, 0)`` for no rows).
    """
    num_rows = indptr.shape[0] - 1
    starts = np.searchsorted(indptr, np.arange(0, int(indptr[-1]), CHUNK_ELEMENTS), side="right")
    bounds = np.unique(np.concatenate([[0], np.maximum(starts - 1, 0), [num_rows]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)) or [(0, 0)]


def _row_blocks(num_rows: int, width: int) -> list[tuple[int, int]]:
    """Consecutive ranges of ``num_rows`` rows of ``width`` values, about
    :data:`CHUNK_ELEMENTS` values each."""
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    return [(s, min(s + step, num_rows)) for s in range(0, num_rows, step)]


class _PartBuilder:
    """Builds the parts of one partitioning one at a time, reading the graph in place.

    The graph's arrays are only read (they may be memory-mapped); per part the builder holds
    its inner and halo ids, row pointers and masks, and streams its edges and feature rows to
    disk in blocks of :data:`CHUNK_ELEMENTS`. Two node-sized buffers (a mark and a local-id
    map) are reused across parts.
    """

    def __init__(self, graph: Graph, owner: np.ndarray, local_inner: np.ndarray) -> None:
        self.graph = graph
        self.in_weight = graph.in_weight()  # GLOBAL weighted in-degrees, float64 (or None)
        self.in_degree = graph.in_degree()  # GLOBAL in-degrees (a cut's: the whole graph's)
        self.owner = owner
        self.local_inner = local_inner
        self.indptr = np.asarray(graph.indptr).astype(np.int64, copy=False)
        self.indices = np.asarray(graph.indices).astype(np.int64, copy=False)
        self.mark = np.zeros(graph.num_nodes, dtype=np.bool_)
        self.local = local_inner.copy()

    def build(self, rank: int, inner: np.ndarray, num_parts: int) -> tuple[dict, np.ndarray, int]:
        """Arrays of part ``rank`` except the send lists (large ones as :class:`ChunkedArray`).

        Returns:
            ``(arrays, halo owners, number of cut incoming edges)``.
        """
        graph, indptr = self.graph, self.indptr
        ni = int(inner.size)
        counts = indptr[inner + 1] - indptr[inner]
        part_indptr = np.zeros(ni + 1, dtype=np.int64)
        np.cumsum(counts, out=part_indptr[1:])
        del counts
        cut = int(_mark_foreign(indptr, self.indices, inner, self.owner, rank, self.mark))
        halo = np.flatnonzero(self.mark)  # ascending global id
        self.mark[halo] = False
        order = np.argsort(self.owner[halo], kind="stable")
        halo = halo[order]  # grouped by owner rank, ascending global id within one
        halo_owner = self.owner[halo]
        recv_offsets = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(halo_owner, minlength=num_parts), out=recv_offsets[1:])
        global_ids = np.concatenate([inner, halo]).astype(np.int64, copy=False)
        features = 0 if graph.x is None else graph.num_features
        arrays = {
            "global_ids": global_ids,
            "indptr": part_indptr,
            "indices": ChunkedArray(
                (int(part_indptr[-1]),), np.dtype(np.int64), self._sources(inner, halo, part_indptr)
            ),
            "in_degree": self.in_degree[global_ids],
            "x": ChunkedArray((ni, features), np.dtype(np.float32), self._features(inner)),
            "y": np.asarray(graph.y[inner], dtype=np.int64),
            "train_mask": np.asarray(graph.train_mask[inner], dtype=np.bool_),
            "val_mask": np.asarray(graph.val_mask[inner], dtype=np.bool_),
            "test_mask": np.asarray(graph.test_mask[inner], dtype=np.bool_),
            "recv_offsets": recv_offsets,
        }
        nnz = int(part_indptr[-1])
        if graph.node_ids is not None:  # a receptive-field cut: the whole graph's ids
            arrays["node_ids"] = np.asarray(graph.node_ids[global_ids], dtype=np.int64)
        if graph.edge_weight is not None:
            arrays["edge_weight"] = ChunkedArray(
                (nnz,), np.dtype(np.float32), self._edge_rows(graph.edge_weight, inner, part_indptr)
            )
            arrays["in_weight"] = self.in_weight[global_ids]
        if graph.edge_attr is not None:
            arrays["edge_attr"] = ChunkedArray(
                (nnz, graph.edge_dim),
                np.dtype(np.float32),
                self._edge_rows(graph.edge_attr, inner, part_indptr),
            )
        return arrays, halo_owner, cut

    def _edge_rows(
        self, values: np.ndarray, inner: np.ndarray, part_indptr: np.ndarray
    ) -> Callable[[], Iterator[np.ndarray]]:
        """Blocks of a per-edge array (``edge_weight``, ``edge_attr``) in the order of the
        part's ``indices``: the incoming edges of every inner node, in the graph's CSR order."""

        def chunks() -> Iterator[np.ndarray]:
            for lo, hi in _edge_blocks(part_indptr):
                counts = np.diff(part_indptr[lo : hi + 1])
                starts = np.repeat(self.indptr[inner[lo:hi]] - part_indptr[lo:hi], counts)
                at = starts + np.arange(part_indptr[lo], part_indptr[hi], dtype=np.int64)
                yield np.asarray(values[at], dtype=np.float32)

        return chunks

    def _sources(
        self, inner: np.ndarray, halo: np.ndarray, part_indptr: np.ndarray
    ) -> Callable[[], Iterator[np.ndarray]]:
        """Blocks of the part's ``indices``: local ids (inner first, then halo) of the sources."""

        def chunks() -> Iterator[np.ndarray]:
            ni = int(inner.size)
            self.local[halo] = ni + np.arange(halo.size, dtype=np.int64)
            try:
                for lo, hi in _edge_blocks(part_indptr):
                    out = np.empty(int(part_indptr[hi] - part_indptr[lo]), dtype=np.int64)
                    _local_sources(self.indptr, self.indices, inner[lo:hi], self.local, out)
                    yield out
            finally:
                self.local[halo] = self.local_inner[halo]

        return chunks

    def _features(self, inner: np.ndarray) -> Callable[[], Iterator[np.ndarray]]:
        """Blocks of the part's feature rows (an empty ``[ni, 0]`` array without features)."""
        x = self.graph.x

        def chunks() -> Iterator[np.ndarray]:
            if x is None:
                yield np.zeros((inner.size, 0), dtype=np.float32)
                return
            for lo, hi in _row_blocks(int(inner.size), x.shape[1]):
                yield np.asarray(x[inner[lo:hi]], dtype=np.float32)

        return chunks


def _drop_graph_pages(graph: Graph) -> None:
    """Unmap the resident pages of the graph's memory-mapped arrays (a cut's features: their
    base): the parts are written one by one, so the process holds one part's pages at a time,
    not the whole graph's (in-memory arrays are left as they are)."""
    x = graph.x.base if isinstance(graph.x, Rows) else graph.x
    for array in (graph.indptr, graph.indices, x, graph.edge_weight, graph.edge_attr):
        drop_resident_pages(array)


def write_partitions(
    graph: Graph,
    owner: np.ndarray,
    out: str | os.PathLike[str],
    *,
    method: str,
    seed: int,
    force: bool = False,
    num_parts: int | None = None,
    timer: StageTimer | None = None,
    notes: list[str] | None = None,
    blocks: NodeBlocks | None = None,
    link: LinkSplit | None = None,
    link_checked: bool = False,
) -> dict:
    """Write the parts that ``owner`` defines to ``out`` (temporary directory, then rename).

    With ``blocks``, every part's inner rows are ordered by (block, global id) and the blocks
    are written too (``block_ids``, ``block_ptr`` and the block keys of ``meta.json``, see
    :mod:`~fullgraph.partition.format`); without, by global id as before. The halo rows and the
    send and receive maps are built from ``owner`` alike in both cases.

    Args:
        graph: the partitioned graph.
        owner: int64 [num_nodes], owner rank of every node, in ``[0, num_parts)``.
        out: the partition directory to create.
        method: partitioning method, recorded in ``meta.json``.
        seed: seed, recorded in ``meta.json``.
        force: replace an existing ``out`` (only a partition fullgraph wrote).
        num_parts: number of parts P (default ``owner.max() + 1``; give it when a part may be
            empty).
        timer: stages already timed (e.g. the assignment), extended with the build stages.
        notes: remarks made while assigning, copied into the report.
        blocks: the node blocks ``owner`` was cut from (every block wholly inside one part).
        link: a link split of ``graph`` (its message-passing graph): every part also holds the
            supervision edges its inner nodes anchor (:mod:`~fullgraph.partition.link_parts`).
        link_checked: ``link`` was checked against ``graph`` already (no second leak check).

    Returns:
        The metadata written to ``out/meta.json`` (with its ``report``).

    Raises:
        FileExistsError: ``out`` exists and ``force`` is false, also when it appears while the
            parts are written (another run); nothing is replaced then.
        ConfigError: ``out`` holds something else than a partition fullgraph wrote (a user's
            folder, a dataset, a folder of other partitions); nothing is replaced.
        DataError: the graph's split masks overlap; ``link`` is malformed, of another graph or
            leaks (:func:`~fullgraph.partition.link_parts.check_link_split`).
        PartitionError: ``owner`` has the wrong shape or values, or splits a block of
            ``blocks``.
    """
    n = graph.num_nodes
    overlap = first_overlap({k: getattr(graph, k) for k in SPLITS})
    if overlap is not None:
        a, b, v = overlap
        raise DataError(
            f"{graph.name}: node {v} is in both the {split_name(a)} and the {split_name(b)} "
            f"split; a node may be in one split only"
        )
    owner = np.asarray(owner)
    if owner.shape != (n,) or not np.issubdtype(owner.dtype, np.integer):
        raise PartitionError(f"owner must be an integer array of shape ({n},), got {owner.shape}")
    owner = owner.astype(np.int64, copy=False)
    if owner.min() < 0:
        raise PartitionError(f"owner holds a negative rank ({int(owner.min())})")
    num_parts = int(owner.max()) + 1 if num_parts is None else num_parts
    check_num_parts(num_parts, n)
    if owner.max() >= num_parts:
        raise PartitionError(f"owner holds rank {int(owner.max())} >= num_parts {num_parts}")
    timer = timer if timer is not None else StageTimer()
    out = Path(out)
    check_partition_out(out, force)
    graph.validate_edge_values()  # NaN / inf edge weights or features are refused here
    if link is not None and not link_checked:
        check_link_split(link, graph)
    cut_link = None if link is None else LinkParts(link, owner, num_parts)

    if blocks is not None:
        check_whole_blocks(blocks, owner)
        key = owner * blocks.num_blocks + blocks.block
    else:
        key = owner
    order = np.argsort(key, kind="stable")  # inner nodes of each rank: (block,) global id
    del key
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=num_parts), out=offsets[1:])
    local_inner = np.empty(n, dtype=np.int64)
    local_inner[order] = np.arange(n, dtype=np.int64) - offsets[owner[order]]

    builder = _PartBuilder(graph, owner, local_inner)
    files: dict[str, dict] = {}
    parts: list[dict] = []
    halos: list[tuple[np.ndarray, np.ndarray]] = []
    edge_cut = 0
    with atomic_dir(out, force=force, ours=PARTITION) as tmp:
        with timer.stage("build_parts"):
            for r in tqdm(range(num_parts), desc="build parts", unit="part", disable=None):
                (tmp / part_dir_name(r)).mkdir()
                inner = order[offsets[r] : offsets[r + 1]]
                arrays, halo_owner, cut = builder.build(r, inner, num_parts)
                edge_cut += cut
                if blocks is not None:
                    arrays.update(part_block_arrays(blocks, inner))
                if cut_link is not None:
                    arrays.update(cut_link.arrays(r))
                for name, array in arrays.items():
                    save_array(tmp, r, name, array, files)
                ni = int(inner.size)
                halos.append((arrays["global_ids"][ni:].copy(), arrays["recv_offsets"]))
                parts.append(
                    {
                        "rank": r,
                        "num_inner": ni,
                        "num_halo": int(halo_owner.size),
                        "num_edges": int(arrays["indptr"][-1]),
                        "num_train": int(arrays["train_mask"].sum()),
                    }
                )
                if blocks is not None:
                    parts[-1]["num_blocks"] = int(arrays["block_ids"].size)
                if cut_link is not None:
                    parts[-1]["link"] = cut_link.counts(r)
                del arrays
                _drop_graph_pages(graph)  # the next part's rows are read afresh
        with timer.stage("send_lists"):
            for r in range(num_parts):
                pieces = [local_inner[halo_gid[recv[r] : recv[r + 1]]] for halo_gid, recv in halos]
                send_offsets = np.zeros(num_parts + 1, dtype=np.int64)
                np.cumsum([p.size for p in pieces], out=send_offsets[1:])
                send_index = np.concatenate(pieces).astype(np.int64)
                save_array(tmp, r, "send_index", send_index, files)
                save_array(tmp, r, "send_offsets", send_offsets, files)
                parts[r]["num_send"] = int(send_index.size)
        meta = {
            "format_version": FORMAT_VERSION,
            "dataset": graph.name,
            "num_nodes": n,
            "num_edges": graph.num_edges,
            "num_features": graph.num_features,
            "num_classes": int(graph.num_classes),
            "num_parts": num_parts,
            "method": method,
            "seed": int(seed),
            "num_train_global": int(graph.train_mask.sum()),
            "edge_cut": int(edge_cut),
            "parts": parts,
            "report": build_report(parts, graph.num_edges, edge_cut, timer, notes or []),
            "files": dict(sorted(files.items())),
        }
        if graph.edge_weight is not None:
            meta["edge_weight"] = True
        if graph.edge_attr is not None:
            meta["edge_dim"] = graph.edge_dim
        if "split" in graph.meta:  # which of the dataset's fixed splits the masks are
            meta["split"] = int(graph.meta["split"])
        if "cut" in graph.meta:  # a receptive-field cut (partition/receptive_cut.py)
            meta["cut"] = dict(graph.meta["cut"])
        if cut_link is not None:
            meta["link"] = cut_link.meta()
        if blocks is not None:
            meta.update(
                num_blocks=blocks.num_blocks,
                block_size=blocks.block_size,
                block_seed=blocks.seed,
                block_metis=blocks.metis,
                block_sha256=blocks.digest(),
            )
        atomic_write_json(tmp / META_NAME, meta)
    return meta


def assign_owners(
    graph: Graph,
    num_parts: int,
    method: str = "metis",
    seed: int = 0,
    metis: str = "auto",
    assign: str | None = None,
    block_size: int | None = None,
    notes: list[str] | None = None,
) -> tuple[np.ndarray, NodeBlocks | None]:
    """Every node's owner and, under ``assign="blocks"`` (``metis``'s default), the blocks the
    parts are runs of (else ``None``): :func:`partition_graph`'s assignment, for other writers."""
    if resolve_assign(method, assign, block_size) == "blocks":
        return block_assignment(
            graph, num_parts, seed=seed, metis=metis, block_size=block_size, notes=notes
        )
    owner = assign_parts(graph, num_parts, method=method, seed=seed, notes=notes, metis=metis)
    return owner, None


def partition_graph(
    graph: Graph,
    num_parts: int,
    out: str | os.PathLike[str],
    method: str = "metis",
    seed: int = 0,
    force: bool = False,
    metis: str = "auto",
    assign: str | None = None,
    block_size: int | None = None,
    link: LinkSplit | None = None,
    cut: CutSpec | None = None,
) -> dict:
    """Assign owners and write the parts with :func:`write_partitions`.

    ``method="metis"`` cuts the graph into fixed node blocks and the block sequence into P
    contiguous runs (``assign="blocks"``, the default: the partition bit-identical training
    needs, :func:`~fullgraph.partition.blocks.block_assignment`), or runs today's k-way METIS
    into P parts (``assign="kway"``, :func:`~fullgraph.partition.assign.assign_parts`);
    ``random`` and ``contiguous`` assign with :func:`~fullgraph.partition.assign.assign_parts`
    and have no blocks.

    Args:
        graph: the graph to split.
        num_parts: number of parts P.
        out: the partition directory to create.
        method: ``metis``, ``random`` or ``contiguous``.
        seed: seed of the method (of the blocks too).
        force: replace an existing ``out`` (only a partition fullgraph wrote).
        metis: METIS library (``auto``, ``libmetis``, ``pymetis``), see :func:`assign_parts`.
        assign: ``blocks`` or ``kway`` with ``metis`` (default ``blocks``); ``None`` otherwise.
        block_size: target nodes per block (``blocks`` only; default
            :func:`~fullgraph.partition.blocks.default_block_size`).
        link: a link split whose message-passing graph is ``graph``, checked (leaks refused)
            before the assignment; the parts carry its supervision edges.
        cut: partition only the receptive field ``cut`` names
            (:mod:`~fullgraph.partition.receptive_cut`; with blocks, the whole graph's blocks
            restricted to it); not with ``link``.

    Returns:
        The metadata written to ``out/meta.json``; ``meta["report"]`` is the partition report.
    """
    check_num_parts(num_parts, graph.num_nodes)
    assign = resolve_assign(method, assign, block_size)
    check_partition_out(out, force)
    if link is not None:
        check_link_split(link, graph)
    timer = StageTimer()
    notes: list[str] = []
    if cut is not None:
        if link is not None:
            raise ConfigError(
                "--cut-hops: a link split's pairs may end at any node; partition it without a cut"
            )
        with timer.stage("cut"):
            graph, owner, blocks = cut_and_assign(
                graph, cut, num_parts, method, seed, metis, assign, block_size, notes
            )
    else:
        with timer.stage("assign"):
            owner, blocks = assign_owners(
                graph, num_parts, method, seed, metis, assign, block_size, notes
            )
    return write_partitions(
        graph,
        owner,
        out,
        method=method,
        seed=seed,
        force=force,
        num_parts=num_parts,
        timer=timer,
        notes=notes,
        blocks=blocks,
        link=link,
        link_checked=True,
    )
