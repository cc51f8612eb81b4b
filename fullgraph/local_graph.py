"""What one rank trains on: its part of the graph, and the aggregation operators built from it.

The trainer reads the fields of :class:`fullgraph.partition.Partition` (``num_inner``,
``num_halo``, ``global_ids``, ``indptr``/``indices``, ``in_degree``, ``x``, ``y``, masks,
``send_index``/``send_offsets``/``recv_offsets``, ``num_classes``, ``num_train_global``,
``partition_hash``). :func:`whole_graph_part` gives the same fields for a whole in-memory
:class:`~fullgraph.datasets.Graph` (one part, no halo), so that one process runs the very code
the ranks run.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from fullgraph.datasets import Graph
from fullgraph.errors import ConfigError, DataError
from fullgraph.halo import SplitOperator
from fullgraph.kernels import CSRMatrix
from fullgraph.partition import Partition


def _graph_hash(graph: Graph) -> str:
    h = hashlib.sha256()
    for arr in (graph.indptr, graph.indices, graph.y, graph.train_mask):
        h.update(np.ascontiguousarray(arr).tobytes())
    if graph.x is not None:
        h.update(np.ascontiguousarray(graph.x).tobytes())
    return "whole-" + h.hexdigest()[:32]


def whole_graph_part(graph: Graph) -> Partition:
    """The whole graph as the single part of a one-rank job.

    Args:
        graph: a validated graph with features.

    Returns:
        A :class:`~fullgraph.partition.Partition` with every node inner and no halo.

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
        meta={"dataset": graph.name, "num_nodes": n, "num_parts": 1},
    )


def _split_columns(a: CSRMatrix, num_inner: int) -> SplitOperator:
    """Split ``a`` (rows = inner, columns = inner + halo) into its inner and halo blocks.

    Both blocks keep every row's entries in ascending column order.
    """
    a = a.sorted_by_column()
    index_dtype = torch.int32 if a.num_cols < 2**31 else torch.int64
    inner = a.select_columns(torch.arange(num_inner)).with_indices(index_dtype)
    if a.num_cols == num_inner:
        return SplitOperator(inner, None)
    halo = a.select_columns(torch.arange(num_inner, a.num_cols)).with_indices(index_dtype)
    return SplitOperator(inner, halo)


def build_operator(part: Any, model: str) -> SplitOperator:
    """The aggregation operator of ``model`` on this rank's rows, split inner / halo.

    ``gcn``: ``D^-1/2 (A + I) D^-1/2`` with GLOBAL degrees + 1 (PyG ``GCNConv``).
    ``sage``: the mean over incoming neighbours (PyG ``SAGEConv(aggr="mean")``).

    Args:
        part: a partition (one of a job's parts, or :func:`whole_graph_part`).
        model: ``gcn`` or ``sage``.

    Returns:
        The :class:`~fullgraph.halo.SplitOperator`, rows = inner nodes.
    """
    ni, nh = int(part.num_inner), int(part.num_halo)
    base = CSRMatrix(
        as_tensor(part.indptr, np.int64), as_tensor(part.indices, np.int64), None, ni + nh
    )
    if model == "gcn":
        deg = as_tensor(part.in_degree, np.int64) + 1
        a = base.with_self_loops().gcn_normalized(deg[:ni], deg)
    elif model == "sage":
        a = base.mean_normalized()
    else:
        raise ConfigError(f"unknown model {model!r} (choose gcn or sage)")
    return _split_columns(a, ni)


def as_tensor(a: Any, dtype: type[np.generic]) -> torch.Tensor:
    """``a`` as a CPU tensor of ``dtype``, sharing its memory when ``a`` is a writable,
    contiguous in-memory array of that dtype, else a copy (read-only memory maps are copied,
    so nothing writes through to a part file)."""
    arr = np.asarray(a)
    if arr.dtype == dtype and arr.flags.writeable and arr.flags.c_contiguous:
        return torch.from_numpy(arr)
    return torch.from_numpy(np.array(arr, dtype=dtype))


def part_tensors(part: Any) -> dict[str, torch.Tensor]:
    """Features, labels and masks of the inner nodes as torch tensors.

    They share the part's arrays when those are in memory (``load_partition(mmap=False)``, a
    whole graph), and copy them out of read-only memory maps.
    """
    return {
        "x": as_tensor(part.x, np.float32),
        "y": as_tensor(part.y, np.int64),
        "train": as_tensor(part.train_mask, np.bool_),
        "val": as_tensor(part.val_mask, np.bool_),
        "test": as_tensor(part.test_mask, np.bool_),
    }
