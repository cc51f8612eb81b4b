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
import scipy.sparse as sp
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
    """Split ``a`` (rows = inner, columns = inner + halo) into its inner and halo blocks."""
    m = a.to_scipy().tocsc()
    inner = sp.csr_matrix(m[:, :num_inner])
    halo = sp.csr_matrix(m[:, num_inner:]) if m.shape[1] > num_inner else None
    index_dtype = torch.int32 if m.shape[1] < 2**31 else torch.int64

    def wrap(block: sp.csr_matrix) -> CSRMatrix:
        block.sort_indices()
        return CSRMatrix(
            torch.from_numpy(block.indptr.astype(np.int64)),
            torch.from_numpy(block.indices.astype(np.int64)).to(index_dtype),
            torch.from_numpy(block.data.astype(np.float32)),
            num_cols=block.shape[1],
        )

    return SplitOperator(wrap(inner), wrap(halo) if halo is not None else None)


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
        np.array(part.indptr, dtype=np.int64),  # copies: parts may be read-only mmaps
        np.array(part.indices, dtype=np.int64),
        num_cols=ni + nh,
    )
    if model == "gcn":
        deg = torch.from_numpy(np.array(part.in_degree, dtype=np.int64)) + 1
        a = base.with_self_loops().gcn_normalized(deg[:ni], deg)
    elif model == "sage":
        a = base.mean_normalized()
    else:
        raise ConfigError(f"unknown model {model!r} (choose gcn or sage)")
    return _split_columns(a, ni)


def part_tensors(part: Any) -> dict[str, torch.Tensor]:
    """Features, labels and masks of the inner nodes as torch tensors (copied from mmaps)."""
    return {
        "x": torch.from_numpy(np.array(part.x, dtype=np.float32)),
        "y": torch.from_numpy(np.array(part.y, dtype=np.int64)),
        "train": torch.from_numpy(np.array(part.train_mask, dtype=np.bool_)),
        "val": torch.from_numpy(np.array(part.val_mask, dtype=np.bool_)),
        "test": torch.from_numpy(np.array(part.test_mask, dtype=np.bool_)),
    }
