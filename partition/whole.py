"""A whole in-memory graph as the single part of a one-rank job.

:func:`whole_graph_part` gives a :class:`~fullgraph.datasets.Graph` the fields of a
:class:`~fullgraph.partition.load.Partition` (every node inner, no halo), so that one process
runs the very code the ranks of a distributed job run. Its blocks are those ``fullgraph
partition`` cuts the same graph into (:func:`~fullgraph.partition.blocks.node_blocks`, same
default block size and seed), so the sums over blocks of one process are those of P ranks; its
rows stay in global id order (callers index the graph's arrays by row) and ``block_rows`` gives
them by block.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.errors import DataError
from fullgraph.partition.blocks import NodeBlocks, node_blocks
from fullgraph.partition.load import Partition


def _graph_hash(graph: Graph) -> str:
    h = hashlib.sha256()
    for arr in (graph.indptr, graph.indices, graph.y, graph.train_mask, graph.edge_weight):
        if arr is None:
            continue
        h.update(np.ascontiguousarray(arr).tobytes())
    for arr in (graph.x, graph.edge_attr):
        if arr is not None:
            h.update(np.ascontiguousarray(arr).tobytes())
    return "whole-" + h.hexdigest()[:32]


def whole_graph_part(
    graph: Graph,
    *,
    block_size: int | None = None,
    block_seed: int = 0,
    metis: str = "auto",
    blocks: NodeBlocks | None = None,
) -> Partition:
    """The whole graph as the single part of a one-rank job.

    Args:
        graph: a validated graph with features.
        block_size: target nodes per block (default that of ``fullgraph partition``).
        block_seed: METIS's seed of the blocks (``fullgraph partition --seed``, default 0).
        metis: METIS library of the blocks (``auto`` as ``fullgraph partition``).
        blocks: blocks already cut (instead of cutting them with the three above).

    Returns:
        A :class:`~fullgraph.partition.load.Partition` with every node inner and no halo; its
        ``block_rows`` orders the rows (global ids) by (block, global id).

    Raises:
        DataError: the graph has no features or no training nodes.
    """
    if graph.x is None:
        raise DataError(f"{graph.name}: graph has no node features to train on")
    n = graph.num_nodes
    num_train = int(graph.train_mask.sum())
    if num_train == 0:
        raise DataError(f"{graph.name}: graph has no training nodes")
    if blocks is None:
        blocks = node_blocks(graph, block_size, block_seed, metis)
    elif blocks.block.shape != (n,):
        raise DataError(f"{graph.name}: blocks of {blocks.block.shape[0]} nodes, not {n}")
    block_ptr = np.zeros(blocks.num_blocks + 1, dtype=np.int64)
    np.cumsum(blocks.sizes(), out=block_ptr[1:])
    return Partition(
        rank=0,
        num_parts=1,
        num_inner=n,
        num_halo=0,
        global_ids=np.arange(n, dtype=np.int64),
        indptr=graph.indptr.astype(np.int64, copy=False),
        indices=graph.indices.astype(np.int64, copy=False),
        in_degree=graph.in_degree(),
        x=graph.x.astype(np.float32, copy=False),
        y=graph.y.astype(np.int64, copy=False),
        train_mask=graph.train_mask,
        val_mask=graph.val_mask,
        test_mask=graph.test_mask,
        send_index=np.zeros(0, dtype=np.int64),
        send_offsets=np.zeros(2, dtype=np.int64),
        recv_offsets=np.zeros(2, dtype=np.int64),
        num_classes=int(graph.num_classes),
        num_features=graph.num_features,
        num_train_global=num_train,
        partition_hash=_graph_hash(graph),
        edge_weight=graph.edge_weight,
        in_weight=graph.in_weight(),
        edge_attr=graph.edge_attr,
        num_blocks=blocks.num_blocks,
        block_ids=np.arange(blocks.num_blocks, dtype=np.int64),
        block_rows=np.argsort(blocks.block, kind="stable").astype(np.int64),
        block_ptr=block_ptr,
        meta={
            "dataset": graph.name,
            "num_nodes": n,
            "num_parts": 1,
            "edge_weight": graph.edge_weight is not None,
            "edge_dim": graph.edge_dim,
            # the block keys of a partition's meta.json: equal digests, equal blocks
            "num_blocks": blocks.num_blocks,
            "block_size": blocks.block_size,
            "block_seed": blocks.seed,
            "block_metis": blocks.metis,
            "block_sha256": blocks.digest(),
            # which of the dataset's fixed splits the masks are, as a partition's meta.json says
            **({"split": int(graph.meta["split"])} if "split" in graph.meta else {}),
        },
    )
