"""A whole in-memory graph as the single part of a one-rank job.

:func:`whole_graph_part` gives a :class:`~fullgraph.datasets.Graph` the fields of a
:class:`~fullgraph.partition.load.Partition` (every node inner, no halo), so that one process
runs the very code the ranks of a distributed job run. Its blocks are those ``fullgraph
partition`` cuts the same graph into (:func:`~fullgraph.partition.blocks.node_blocks`, same
default block size and seed), so the sums over blocks of one process are those of P ranks.

Its rows are in block order by default (``order="blocks"``): ordered by (block, global id) as
``fullgraph partition --parts 1`` writes its one part, ``global_ids`` that permutation, the
CSR's rows and columns renumbered, features, labels, masks and per-edge values permuted alike,
and ``block_rows`` the identity: the blocks are contiguous row ranges and the block tree gathers
nothing. A caller that indexes the graph's arrays by row asks for ``order="global"`` (local id =
global id, ``block_rows`` a permutation); the sums are the same bits in either order.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.link import LinkSplit
from fullgraph.errors import ConfigError, DataError
from fullgraph.partition.blocks import NodeBlocks, node_blocks
from fullgraph.partition.link_parts import LinkParts, check_link_split, link_view
from fullgraph.partition.load import Partition

#: The row orders :func:`whole_graph_part` gives: by (block, global id), or by global id.
ORDERS = ("blocks", "global")


def _graph_hash(graph: Graph, link_digest: str | None = None) -> str:
    h = hashlib.sha256()
    if link_digest is not None:  # the split is part of what the run trains on
        h.update(link_digest.encode())
    for arr in (graph.indptr, graph.indices, graph.y, graph.train_mask, graph.edge_weight):
        if arr is None:
            continue
        h.update(np.ascontiguousarray(arr).tobytes())
    for arr in (graph.x, graph.edge_attr):
        if arr is not None:
            h.update(np.ascontiguousarray(arr).tobytes())
    return "whole-" + h.hexdigest()[:32]


def _edge_positions(indptr: np.ndarray, rows: np.ndarray, new_indptr: np.ndarray) -> np.ndarray:
    """Positions in the graph's CSR of the incoming edges of ``rows``, row after row in CSR
    order (the edges of the renumbered CSR whose row pointer is ``new_indptr``)."""
    counts = np.diff(new_indptr)
    starts = np.repeat(indptr[rows] - new_indptr[:-1], counts)
    return starts + np.arange(int(new_indptr[-1]), dtype=np.int64)


def _arrays(graph: Graph, rows: np.ndarray | None) -> dict[str, np.ndarray | None]:
    """The per-node and per-edge arrays of the part whose row ``i`` is node ``rows[i]``
    (``None``: the identity, the graph's arrays themselves where their dtypes allow)."""
    indptr = graph.indptr.astype(np.int64, copy=False)
    indices = graph.indices.astype(np.int64, copy=False)
    in_weight = graph.in_weight()
    if rows is None:
        return {
            "indptr": indptr,
            "indices": indices,
            "in_degree": graph.in_degree(),
            "x": graph.x.astype(np.float32, copy=False),
            "y": graph.y.astype(np.int64, copy=False),
            "train_mask": graph.train_mask,
            "val_mask": graph.val_mask,
            "test_mask": graph.test_mask,
            "edge_weight": graph.edge_weight,
            "in_weight": in_weight,
            "edge_attr": graph.edge_attr,
        }
    n = graph.num_nodes
    local = np.empty(n, dtype=np.int64)
    local[rows] = np.arange(n, dtype=np.int64)
    degree = graph.in_degree()
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree[rows], out=new_indptr[1:])
    at = _edge_positions(indptr, rows, new_indptr)
    return {
        "indptr": new_indptr,
        "indices": local[indices[at]],
        "in_degree": degree[rows],
        "x": np.asarray(graph.x[rows], dtype=np.float32),
        "y": np.asarray(graph.y[rows], dtype=np.int64),
        "train_mask": np.asarray(graph.train_mask[rows], dtype=np.bool_),
        "val_mask": np.asarray(graph.val_mask[rows], dtype=np.bool_),
        "test_mask": np.asarray(graph.test_mask[rows], dtype=np.bool_),
        "edge_weight": (
            None if graph.edge_weight is None else np.asarray(graph.edge_weight[at], np.float32)
        ),
        "in_weight": None if in_weight is None else in_weight[rows],
        "edge_attr": (
            None if graph.edge_attr is None else np.asarray(graph.edge_attr[at], np.float32)
        ),
    }


def whole_graph_part(
    graph: Graph,
    *,
    block_size: int | None = None,
    block_seed: int = 0,
    metis: str = "auto",
    blocks: NodeBlocks | None = None,
    order: str = "blocks",
    link: LinkSplit | None = None,
) -> Partition:
    """The whole graph as the single part of a one-rank job.

    Args:
        graph: a validated graph with features.
        block_size: target nodes per block (default that of ``fullgraph partition``).
        block_seed: METIS's seed of the blocks (``fullgraph partition --seed``, default 0).
        metis: METIS library of the blocks (``auto`` as ``fullgraph partition``).
        blocks: blocks already cut (instead of cutting them with the three above).
        order: ``"blocks"``: rows ordered by (block, global id), the arrays of ``fullgraph
            partition --parts 1``'s part (``block_rows`` the identity); ``"global"``: rows in
            global id order (``global_ids`` the identity, ``block_rows`` orders them by block).
        link: a link split whose message-passing graph is ``graph`` (checked, leaks refused):
            ``Partition.link`` holds it whole, the arrays ``fullgraph partition --parts 1``
            writes (every anchor inner), and ``meta["link"]`` its description.

    Returns:
        A :class:`~fullgraph.partition.load.Partition` with every node inner and no halo.

    Raises:
        DataError: the graph has no features or (without ``link``) no training nodes,
            ``blocks`` do not fit it, or ``link`` is malformed, of another graph or leaks.
        ConfigError: ``order`` is not one of :data:`ORDERS`.
    """
    if order not in ORDERS:
        raise ConfigError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if graph.x is None:
        raise DataError(f"{graph.name}: graph has no node features to train on")
    n = graph.num_nodes
    num_train = int(graph.train_mask.sum())
    if num_train == 0 and link is None:  # a link graph trains on its edges
        raise DataError(f"{graph.name}: graph has no training nodes")
    cut_link = None
    if link is not None:
        cut_link = LinkParts(check_link_split(link, graph), np.zeros(n, dtype=np.int64), 1)
    if blocks is None:
        blocks = node_blocks(graph, block_size, block_seed, metis)
    elif blocks.block.shape != (n,):
        raise DataError(f"{graph.name}: blocks of {blocks.block.shape[0]} nodes, not {n}")
    by_block = np.argsort(blocks.block, kind="stable").astype(np.int64)  # (block, global id)
    block_ptr = np.zeros(blocks.num_blocks + 1, dtype=np.int64)
    np.cumsum(blocks.sizes(), out=block_ptr[1:])
    if order == "blocks":
        global_ids, block_rows = by_block, np.arange(n, dtype=np.int64)
        arrays = _arrays(graph, by_block)
    else:
        global_ids, block_rows = np.arange(n, dtype=np.int64), by_block
        arrays = _arrays(graph, None)
    return Partition(
        rank=0,
        num_parts=1,
        num_inner=n,
        num_halo=0,
        global_ids=global_ids,
        send_index=np.zeros(0, dtype=np.int64),
        send_offsets=np.zeros(2, dtype=np.int64),
        recv_offsets=np.zeros(2, dtype=np.int64),
        num_classes=int(graph.num_classes),
        num_features=graph.num_features,
        num_train_global=num_train,
        partition_hash=_graph_hash(graph, None if cut_link is None else cut_link.digest),
        num_blocks=blocks.num_blocks,
        block_ids=np.arange(blocks.num_blocks, dtype=np.int64),
        block_rows=block_rows,
        block_ptr=block_ptr,
        link=None if cut_link is None else link_view(cut_link.arrays(0)),
        **arrays,
        meta={
            "dataset": graph.name,
            "num_nodes": n,
            "num_parts": 1,
            "edge_weight": graph.edge_weight is not None,
            "edge_dim": graph.edge_dim,
            "row_order": order,
            # the block keys of a partition's meta.json: equal digests, equal blocks
            "num_blocks": blocks.num_blocks,
            "block_size": blocks.block_size,
            "block_seed": blocks.seed,
            "block_metis": blocks.metis,
            "block_sha256": blocks.digest(),
            # which of the dataset's fixed splits the masks are, as a partition's meta.json says
            **({"split": int(graph.meta["split"])} if "split" in graph.meta else {}),
            **({} if cut_link is None else {"link": cut_link.meta()}),
        },
    )
