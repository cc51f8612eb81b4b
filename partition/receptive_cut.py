"""The exact receptive-field cut: only the nodes within L hops of the labelled nodes.

An L-layer message-passing model reads, for a node ``v``, the inputs of the nodes within L hops
of ``v`` along incoming edges, and nothing else. Training and evaluation touch the outputs of the
labelled nodes only (the training, validation and test nodes, or the splits named), so the graph
they need is the L-hop in-neighbourhood of those nodes (Bajaj et al.'s papers100M runs train on
the 2-hop neighbourhood of the labelled 1.4%). :func:`cut_graph` keeps those nodes and the edges
between them, and keeps what the cut would otherwise change:

- every node's in-degree (and weighted in-degree) in the whole graph, which GCN's normalisation
  reads for a source node whose own in-edges the cut dropped
  (:attr:`~fullgraph.datasets.graph.Graph.full_in_degree`);
- every node's id in the whole graph (:attr:`~fullgraph.datasets.graph.Graph.node_ids`): the
  key of its dropout stream and GAT's attention-dropout streams, and the order of every
  aggregation's sums (the cut's ids are in the same order, so the sums are too).

A node at distance ``d <= L`` keeps all its in-edges when ``d < L``; its output at layer ``l``
is then the whole graph's wherever ``d + l <= L``, which covers every value the labelled nodes'
outputs read. The others (``d + l > L``) differ from the whole graph's but carry exactly zero
gradient in both.

**Bit for bit** on a partition with blocks (``--assign blocks``): the blocks are cut on the
whole graph (never on the cut, whose blocks would differ), then restricted to the kept nodes.
A block that keeps no node keeps its first node as a placeholder (so the block tree over the
blocks is the whole graph's; a placeholder is outside the receptive field, its gradient zero).
Each block's partial sums (weight and bias gradients, the loss) see the block's rows at their
positions in the whole graph's block, zero rows where nodes were cut
(:class:`~fullgraph.distributed.tree_sum.BlockLayout`): the same inputs as the whole graph's
partials, where those rows carry zero gradient, so the same bits. Without blocks (k-way,
KaMinPar, random) the cut trains to float rounding of the whole graph.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numba
import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.errors import ConfigError, DataError
from fullgraph.partition.assign import assign_parts
from fullgraph.partition.blocks import (
    NodeBlocks,
    block_loads,
    check_block_size,
    default_block_size,
    node_blocks,
    parts_from_blocks,
)

#: The splits a cut may start from, as ``--cut-splits`` names them.
CUT_SPLITS = {"train": "train_mask", "val": "val_mask", "test": "test_mask"}

#: The most hops a cut accepts (a deeper model is not what the cut is for).
MAX_CUT_HOPS = 32


@dataclass(frozen=True)
class CutSpec:
    """A receptive-field cut: ``hops`` hops of in-edges around the nodes of ``splits``."""

    hops: int
    splits: tuple[str, ...] = ("train", "val", "test")


def check_cut(hops: object, splits: str | tuple[str, ...] | None = None) -> CutSpec:
    """``--cut-hops`` and ``--cut-splits`` checked: hops an integer in ``[1, MAX_CUT_HOPS]``,
    splits a comma-separated subset of train, val, test (default all three).

    Raises:
        ConfigError: one line naming the value.
    """
    if isinstance(hops, bool) or not isinstance(hops, (int, np.integer)):
        raise ConfigError(f"--cut-hops must be an integer number of hops, got {hops!r}")
    if hops < 1:
        raise ConfigError(
            f"--cut-hops must be at least 1 (the model's layers), got {hops}: a 0-hop cut keeps "
            "the labelled nodes without their neighbours, which no graph layer can train on"
        )
    if hops > MAX_CUT_HOPS:
        raise ConfigError(f"--cut-hops {hops} exceeds {MAX_CUT_HOPS}; give the model's layers")
    if splits is None:
        names: tuple[str, ...] = tuple(CUT_SPLITS)
    elif isinstance(splits, str):
        names = tuple(s.strip() for s in splits.split(",") if s.strip())
    else:
        names = tuple(splits)
    unknown = [s for s in names if s not in CUT_SPLITS]
    if unknown or not names:
        what = f"unknown split {unknown[0]!r}" if unknown else "no split named"
        raise ConfigError(
            f"--cut-splits: {what} (choose from {', '.join(CUT_SPLITS)}, comma-separated)"
        )
    return CutSpec(int(hops), tuple(dict.fromkeys(names)))


@numba.njit(cache=True, nogil=True)
def _expand(indptr, indices, frontier, dist, d, out):  # pragma: no cover - compiled by numba
    """Mark the unseen sources of ``frontier``'s in-edges at distance ``d``; return how many."""
    k = 0
    for v in frontier:
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if dist[u] < 0:
                dist[u] = d
                out[k] = u
                k += 1
    return k


def hop_distance(graph: Graph, seeds: np.ndarray, hops: int) -> np.ndarray:
    """Every node's distance along incoming edges to the nearest seed, up to ``hops``.

    Args:
        graph: the graph (CSR of incoming edges).
        seeds: bool [num_nodes].
        hops: the most hops searched.

    Returns:
        int32 [num_nodes]: 0 at a seed, ``d`` for a node ``d <= hops`` hops from one (an edge
        path ``node -> ... -> seed``), -1 beyond.
    """
    dist = np.full(graph.num_nodes, -1, dtype=np.int32)
    frontier = np.flatnonzero(seeds).astype(np.int64)
    dist[frontier] = 0
    indptr = np.asarray(graph.indptr, dtype=np.int64)
    indices = np.asarray(graph.indices, dtype=np.int64)
    out = np.empty(graph.num_nodes, dtype=np.int64)
    for d in range(1, hops + 1):
        if not frontier.size:
            break
        k = _expand(indptr, indices, frontier, dist, np.int32(d), out)
        frontier = out[:k].copy()
    return dist


@numba.njit(cache=True, nogil=True)
def _induced_counts(indptr, indices, keep, ids, out_ptr):  # pragma: no cover - compiled
    """Row pointer of the subgraph on ``ids``: every kept row's count of kept sources."""
    k = 0
    for i in range(ids.size):
        v = ids[i]
        for e in range(indptr[v], indptr[v + 1]):
            if keep[indices[e]]:
                k += 1
        out_ptr[i + 1] = k


@numba.njit(cache=True, nogil=True)
def _induced(indptr, indices, keep, new_id, ids, out_idx, edge):  # pragma: no cover - compiled
    """The subgraph's sources (every kept row's kept sources in their order, renumbered) and
    the position of each kept entry in the whole CSR."""
    k = 0
    for i in range(ids.size):
        v = ids[i]
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if keep[u]:
                out_idx[k] = new_id[u]
                edge[k] = e
                k += 1


def _kept_edges(graph: Graph, keep: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(indptr, indices, edge positions)`` of the subgraph induced on ``ids``."""
    indptr = np.asarray(graph.indptr, dtype=np.int64)
    indices = np.asarray(graph.indices, dtype=np.int64)
    new_id = np.full(graph.num_nodes, -1, dtype=np.int64)
    new_id[ids] = np.arange(ids.size, dtype=np.int64)
    out_ptr = np.zeros(ids.size + 1, dtype=np.int64)
    _induced_counts(indptr, indices, keep, ids, out_ptr)
    out_idx = np.empty(int(out_ptr[-1]), dtype=np.int64)
    edge = np.empty(int(out_ptr[-1]), dtype=np.int64)
    _induced(indptr, indices, keep, new_id, ids, out_idx, edge)
    return out_ptr, out_idx, edge


class Rows:
    """Rows ``ids`` of an array, read when indexed (the cut's features: the whole graph's
    stay memory-mapped, and the parts copy them a block of rows at a time, as they copy an
    uncut graph's)."""

    def __init__(self, base: np.ndarray, ids: np.ndarray) -> None:
        self.base, self.ids = base, ids
        self.shape = (int(ids.size), *base.shape[1:])
        self.dtype = base.dtype
        self.ndim = base.ndim

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: object) -> np.ndarray:
        return np.asarray(self.base[self.ids[key]])

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return np.asarray(self.base[self.ids], dtype=dtype)


@dataclass
class Cut:
    """What :func:`cut_graph` kept.

    Attributes:
        graph: the cut graph (its ``node_ids``, ``full_in_degree`` set).
        blocks: the whole graph's blocks restricted to the kept nodes (with the positions of
            the kept nodes in their blocks), or ``None`` without blocks.
        record: the ``meta.json`` ``cut`` record.
    """

    graph: Graph
    blocks: NodeBlocks | None
    record: dict


def _block_positions(blocks: NodeBlocks) -> np.ndarray:
    """Every node's position in its block in the whole graph's (block, id) order."""
    n = blocks.block.size
    order = np.argsort(blocks.block, kind="stable")
    starts = np.concatenate([[0], np.cumsum(blocks.sizes())[:-1]])
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64) - starts[blocks.block[order]]
    return position


def _placeholders(dist: np.ndarray, blocks: NodeBlocks, position: np.ndarray) -> np.ndarray:
    """The first node (position 0) of every block that keeps no node within the hops."""
    inside = np.zeros(blocks.num_blocks, dtype=bool)
    inside[blocks.block[dist >= 0]] = True
    return np.flatnonzero((position == 0) & ~inside[blocks.block])


def _restrict_blocks(blocks: NodeBlocks, ids: np.ndarray, position: np.ndarray) -> NodeBlocks:
    """``blocks`` on the kept nodes ``ids``: their blocks, their positions in their block in
    the whole graph (``position``), and every block's size there."""
    return NodeBlocks(
        block=blocks.block[ids].copy(),
        num_blocks=blocks.num_blocks,
        block_size=blocks.block_size,
        seed=blocks.seed,
        metis=blocks.metis,
        position=position[ids],
        full_rows=blocks.sizes().astype(np.int64),
    )


def _split_mask(graph: Graph, mask: str, ids: np.ndarray, spec: CutSpec) -> np.ndarray:
    """A split's mask on the kept nodes; all false for a split the cut was not made for (its
    kept nodes lack their receptive fields: evaluating them would be silently wrong)."""
    if mask not in (CUT_SPLITS[s] for s in spec.splits):
        return np.zeros(ids.size, dtype=bool)
    return np.asarray(getattr(graph, mask)[ids], dtype=bool)


def cut_graph(graph: Graph, spec: CutSpec, blocks: NodeBlocks | None = None) -> Cut:
    """The receptive-field cut of ``graph`` (see the module docstring).

    Args:
        graph: the whole graph.
        spec: hops and seed splits.
        blocks: the whole graph's blocks, or ``None`` (a partition without blocks).

    Returns:
        The :class:`Cut`.

    Raises:
        DataError: the named splits hold no node.
    """
    seeds = seed_mask(graph, spec.splits)
    if not seeds.any():
        raise DataError(
            f"{graph.name}: --cut-splits {','.join(spec.splits)} holds no node; nothing to cut to"
        )
    dist = hop_distance(graph, seeds, spec.hops)
    keep = dist >= 0
    position = None if blocks is None else _block_positions(blocks)
    extra = np.zeros(0, np.int64) if position is None else _placeholders(dist, blocks, position)
    keep[extra] = True
    ids = np.flatnonzero(keep).astype(np.int64)
    indptr, indices, edge = _kept_edges(graph, keep, ids)
    base = graph.node_ids
    weight = graph.in_weight()
    sub = Graph(
        name=graph.name,
        num_nodes=int(ids.size),
        indptr=indptr,
        indices=indices,
        x=None if graph.x is None else Rows(graph.x, ids),  # type: ignore[arg-type]
        y=np.asarray(graph.y[ids]),
        **{mask: _split_mask(graph, mask, ids, spec) for mask in CUT_SPLITS.values()},
        num_classes=graph.num_classes,
        meta=dict(graph.meta),
        edge_weight=None if graph.edge_weight is None else np.asarray(graph.edge_weight)[edge],
        edge_attr=None if graph.edge_attr is None else np.asarray(graph.edge_attr)[edge],
        node_ids=ids.copy() if base is None else np.asarray(base)[ids],
        full_in_degree=graph.in_degree()[ids],
        full_in_weight=None if weight is None else weight[ids],
    )
    per_hop = np.bincount(dist[dist >= 0], minlength=spec.hops + 1)
    record = {
        "hops": spec.hops,
        "splits": list(spec.splits),
        "dropped_splits": [s for s in CUT_SPLITS if s not in spec.splits],
        "seeds": int(seeds.sum()),
        "nodes_per_hop": [int(c) for c in per_hop],
        "placeholders": int(extra.size),
        "num_nodes": int(ids.size),
        "num_edges": int(indices.size),
        "whole_num_nodes": int(graph.num_nodes),
        "whole_num_edges": int(graph.num_edges),
        "node_ids_sha256": ids_digest(sub.node_ids),
    }
    sub.meta["cut"] = record
    cut_blocks = None if position is None else _restrict_blocks(blocks, ids, position)
    return Cut(sub, cut_blocks, record)


def cut_and_assign(
    graph: Graph,
    spec: CutSpec,
    num_parts: int,
    method: str,
    seed: int,
    metis: str,
    assign: str | None,
    block_size: int | None,
    notes: list[str],
) -> tuple[Graph, np.ndarray, NodeBlocks | None]:
    """Cut ``graph`` to ``spec``'s receptive field and assign the cut's owners:
    :func:`~fullgraph.partition.build.partition_graph`'s assignment with a cut.

    Under ``assign="blocks"`` the whole graph's blocks (:func:`node_blocks`, the same as an
    uncut partition's) are restricted to the cut and its parts are runs of them balancing the
    cut's loads; otherwise ``method`` runs on the cut graph.

    Returns:
        ``(cut graph, owner of every cut node, the cut's blocks or None)``.
    """
    if assign == "blocks":
        n = graph.num_nodes
        size = default_block_size(n) if block_size is None else check_block_size(block_size, n)
        cut = cut_graph(graph, spec, node_blocks(graph, size, seed, metis, notes))
        assert cut.blocks is not None
        nb = cut.blocks.num_blocks
        part = parts_from_blocks(block_loads(cut.graph, cut.blocks.block, nb), num_parts)
        owner = part[cut.blocks.block]
    else:
        cut = cut_graph(graph, spec)
        owner = assign_parts(
            cut.graph, num_parts, method=method, seed=seed, notes=notes, metis=metis
        )
    notes.append(describe_cut(cut.record))
    return cut.graph, owner, cut.blocks


def ids_digest(node_ids: np.ndarray) -> str:
    """Hex SHA-256 of the kept nodes' ids (int64 little-endian), what ``meta.json`` keeps."""
    data = np.ascontiguousarray(node_ids, dtype="<i8")
    return hashlib.sha256(data.view(np.uint8)).hexdigest()


def seed_mask(graph: Graph, splits: tuple[str, ...] | list[str]) -> np.ndarray:
    """bool [num_nodes]: the nodes of the named splits (``train``, ``val``, ``test``)."""
    mask = np.zeros(graph.num_nodes, dtype=bool)
    for name in splits:
        mask |= np.asarray(getattr(graph, CUT_SPLITS[name]), dtype=bool)
    return mask


def describe_cut(record: dict) -> str:
    """One line: what a cut kept."""
    share = record["num_nodes"] / max(1, record["whole_num_nodes"])
    edges = record["num_edges"] / max(1, record["whole_num_edges"])
    per_hop = ", ".join(f"{c:,}" for c in record["nodes_per_hop"])
    return (
        f"receptive-field cut: {record['hops']} hop{'s' if record['hops'] != 1 else ''} of "
        f"{'/'.join(record['splits'])} "
        f"({record['seeds']:,} nodes): {record['num_nodes']:,} of "
        f"{record['whole_num_nodes']:,} nodes ({share:.1%}; per hop {per_hop}; "
        f"{record['placeholders']} block placeholders), {record['num_edges']:,} of "
        f"{record['whole_num_edges']:,} edges ({edges:.1%})"
    )
