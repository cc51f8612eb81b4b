"""The PyG peer of the training benchmarks: the same model from PyG layers, its step timed.

``bench/train.py`` (``GCNConv``) and ``bench/gat.py`` (``GATConv``) time our trainer's step
against this one: the whole graph in one process, Adam, cross-entropy on the training nodes,
ReLU and dropout between layers, dropout on the input where the model has it. The layers are
built by :func:`gcn_layers` or :func:`gat_layers`; :func:`measure` loads the graph, times the
steps and returns the figures a worker prints (:func:`bench.child.emit_result`). torch and PyG
are imported inside, so that a benchmark's parent process does not pay for them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from fullgraph.datasets.graph import Graph

#: How the layers take the graph: ``edge_index`` ([2, nnz], source then target) or ``csr``
#: (``adj_t``: a sparse CSR matrix of the in-edges, ones, rows the targets).
ADJACENCIES = ("edge_index", "csr")


def edge_index(graph: Graph) -> torch.Tensor:
    """PyG's ``edge_index`` of ``graph``'s in-edge CSR: row 0 the sources, row 1 the targets."""
    import numpy as np
    import torch

    rows = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(graph.indptr))
    return torch.from_numpy(np.stack([graph.indices.astype(np.int64), rows]))


def csr_adjacency(graph: Graph) -> torch.Tensor:
    """PyG's ``adj_t`` of ``graph``: its in-edge CSR as a sparse CSR tensor of ones."""
    import torch

    n = graph.num_nodes
    return torch.sparse_csr_tensor(
        torch.from_numpy(graph.indptr),
        torch.from_numpy(graph.indices),
        torch.ones(graph.num_edges),
        size=(n, n),
    )


def gcn_layers(graph: Graph, hidden: int, layers: int) -> torch.nn.ModuleList:
    """``layers`` ``GCNConv(cached=True)`` from the graph's features to its classes."""
    import torch
    from torch_geometric.nn import GCNConv

    dims = [graph.num_features] + [hidden] * (layers - 1) + [graph.num_classes]
    pairs = zip(dims[:-1], dims[1:], strict=True)
    return torch.nn.ModuleList(GCNConv(i, o, cached=True) for i, o in pairs)


def gat_layers(
    graph: Graph, hidden: int, heads: int, layers: int, dropout: float
) -> torch.nn.ModuleList:
    """``layers`` ``GATConv``: ``heads`` heads of width ``hidden`` concatenated, one averaged
    output head; attention dropout ``dropout``."""
    import torch
    from torch_geometric.nn import GATConv

    dims = [graph.num_features] + [hidden * heads] * (layers - 1)
    convs = torch.nn.ModuleList(GATConv(d, hidden, heads=heads, dropout=dropout) for d in dims[:-1])
    convs.append(GATConv(dims[-1], graph.num_classes, heads=1, concat=False, dropout=dropout))
    return convs


def train_step(
    convs: torch.nn.ModuleList,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    adjacency: torch.Tensor,
    y: torch.Tensor,
    train: torch.Tensor,
    dropout: float,
    input_dropout: float = 0.0,
) -> None:
    """One training step: forward through ``convs`` (ReLU and dropout between layers),
    cross-entropy on the ``train`` nodes, backward, ``opt.step()``."""
    import torch.nn.functional as F

    convs.train()
    opt.zero_grad()
    h = F.dropout(x, input_dropout, training=True) if input_dropout > 0 else x
    for i, conv in enumerate(convs):
        h = conv(h, adjacency)
        if i < len(convs) - 1:
            h = F.dropout(F.relu(h), dropout, training=True)
    F.cross_entropy(h[train], y[train]).backward()
    opt.step()


def measure(
    dataset: str,
    root: str,
    threads: int,
    build: Callable[[Graph], torch.nn.ModuleList],
    *,
    adjacency: str = "edge_index",
    dropout: float = 0.5,
    input_dropout: float = 0.0,
    lr: float = 0.01,
    weight_decay: float = 0.0,
    warmup: int = 1,
    epochs: int = 5,
) -> dict[str, float]:
    """Time the PyG model ``build(graph)`` on ``dataset``, one process, ``threads`` threads.

    Args:
        dataset, root: the graph (``fullgraph.datasets.registry.load``).
        threads: torch / numba threads (:func:`bench.common.setup_threads`).
        build: the layers from the graph (:func:`gcn_layers`, :func:`gat_layers`), built
            after ``torch.manual_seed(0)``.
        adjacency: one of :data:`ADJACENCIES`.
        dropout, input_dropout: between layers, on the input (0: none, not drawn).
        lr, weight_decay: Adam's.
        warmup, epochs: untimed steps, then timed ones.

    Returns:
        ``step_s`` (median of the timed steps), ``peak_rss_mb`` and ``base_rss_mb`` (the RSS
        before the graph was loaded).
    """
    import torch

    from bench.common import setup_threads
    from fullgraph.datasets.registry import load
    from fullgraph.resources import current_rss_mb, peak_rss_mb

    if adjacency not in ADJACENCIES:
        raise ValueError(f"adjacency {adjacency!r}: one of {ADJACENCIES}")
    setup_threads(threads)
    base_rss = current_rss_mb()
    g = load(dataset, root)
    adj = edge_index(g) if adjacency == "edge_index" else csr_adjacency(g)
    x, y = torch.from_numpy(g.x), torch.from_numpy(g.y)
    train = torch.from_numpy(g.train_mask)
    torch.manual_seed(0)
    convs = build(g)
    opt = torch.optim.Adam(convs.parameters(), lr=lr, weight_decay=weight_decay)
    times = []
    for epoch in range(warmup + epochs):
        t0 = time.perf_counter()
        train_step(convs, opt, x, adj, y, train, dropout, input_dropout)
        if epoch >= warmup:
            times.append(time.perf_counter() - t0)
    return {
        "step_s": statistics.median(times),
        "peak_rss_mb": peak_rss_mb(),
        "base_rss_mb": base_rss,
    }
