"""A whole in-memory graph as the single part of a one-rank job.

:func:`whole_graph_part` gives a :class:`~fullgraph.datasets.Graph` the fields of a
:class:`~fullgraph.partition.load.Partition` (every node inner, no halo), so that one process
runs the very code the ranks of a distributed job run.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.errors import DataError
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


def whole_graph_part(graph: Graph) -> Partition:
    """The whole graph as the single part of a one-rank job.

    Args:
        graph: a validated graph with features.

    Returns:
        A :class:`~fullgraph.partition.load.Partition` with every node inner and no halo.

    Raises:
        DataError: the graph has no features or no training nodes.
    """
    if graph.x is None:
        raise DataError(f"{graph.name}: graph has no node features to train on")
    n = graph.num_nodes
    num_train = int(graph.train_mask.sum())
    if num_train == 0:
        raise DataError(f"{graph.name}: graph has no training nodes")
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
        meta={
            "dataset": graph.name,
            "num_nodes": n,
            "num_parts": 1,
            "edge_weight": graph.edge_weight is not None,
            "edge_dim": graph.edge_dim,
            # which of the dataset's fixed splits the masks are, as a partition's meta.json says
            **({"split": int(graph.meta["split"])} if "split" in graph.meta else {}),
        },
    )
