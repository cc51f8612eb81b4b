"""Neighbour-sampler throughput: sampled edges per second, ours against PyG's when installed.

Samples the blocks of ``--batches`` batches of ``--batch-size`` training seeds with the given
fanouts (fanouts[0] at the seeds, PyG's ``num_neighbors`` order) and reports sampled edges per
second for 1 thread and for all cores. PyG's ``NeighborLoader`` needs ``pyg-lib`` or
``torch-sparse`` for its sampler; when neither is installed its row is skipped with the reason.

    python -m bench.sampler --dataset arxiv-synth --root /tmp/fg-data [--out bench/results]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import CSVWriter, command_line, median
from fullgraph.datasets import load
from fullgraph.kernels.cpu_launch import set_threads
from fullgraph.minibatch.sampler import NeighborSampler, global_batches


def ours(graph, fanouts: list[int], batches: list[np.ndarray], repeat: int) -> list[float]:
    """Edges per second of :class:`NeighborSampler`, one value per repetition."""
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, seed=0)
    sampler.sample(batches[0])  # compile / load the cache
    rates = []
    for _ in range(repeat):
        edges, t0 = 0, time.perf_counter()
        for i, b in enumerate(batches):
            edges += sampler.sample(b, epoch=0, batch=i).num_sampled_edges
        rates.append(edges / (time.perf_counter() - t0))
    return rates


def pyg_missing() -> str | None:
    """Why PyG's NeighborLoader cannot sample here, or ``None`` when it can."""
    if importlib.util.find_spec("pyg_lib") or importlib.util.find_spec("torch_sparse"):
        return None
    return "neither pyg-lib nor torch-sparse is installed (no wheels for torch 2.13 CPU)"


def pyg(graph, fanouts: list[int], batches: list[np.ndarray], repeat: int) -> list[float]:
    """Edges per second of PyG's ``NeighborLoader`` on the same graph, seeds and fanouts."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    rows = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    edge_index = torch.from_numpy(np.stack([graph.indices, rows]))
    data = Data(edge_index=edge_index, num_nodes=graph.num_nodes)
    seeds = torch.from_numpy(np.concatenate(batches))
    loader = NeighborLoader(data, fanouts, input_nodes=seeds, batch_size=len(batches[0]))
    rates = []
    for _ in range(repeat):
        edges, t0 = 0, time.perf_counter()
        for sub in loader:
            edges += int(sub.edge_index.shape[1])
        rates.append(edges / (time.perf_counter() - t0))
    return rates


def main() -> int:
    """Measure, print, append CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="arxiv-synth")
    ap.add_argument("--root", default="/tmp/fg-data")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    graph = load(args.dataset, args.root)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    train = np.flatnonzero(graph.train_mask)
    batches = global_batches(train, args.batch_size, 0, 0)[: args.batches]
    csv = CSVWriter(Path(args.out) / "sampler.csv")
    what = f"sampler/{args.dataset}/fanouts={args.fanouts}/batch={args.batch_size}"
    cores = os.cpu_count() or 1
    for threads in sorted({1, cores}):
        set_threads(threads)
        rate = median(ours(graph, fanouts, batches, args.repeat))
        csv.write(what, "fullgraph", "sampled_edges_per_s", "edges/s", threads, rate)
        print(f"fullgraph NeighborSampler, {threads} thread(s): {rate / 1e6:.2f} M edges/s")
        reason = pyg_missing()
        if reason:
            print(f"PyG NeighborLoader, {threads} thread(s): skipped: {reason}")
            continue
        rate = median(pyg(graph, fanouts, batches, args.repeat))
        csv.write(what, "pyg", "sampled_edges_per_s", "edges/s", threads, rate)
        print(f"PyG NeighborLoader, {threads} thread(s): {rate / 1e6:.2f} M edges/s")
    print(f"rows appended to {csv.path}; reproduce with: {command_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
