"""Statistics of synthetic graphs beside the real ones: degrees, homophily, METIS halo, accuracy.

For every preset (generated in this process) or dataset on disk it measures nodes, undirected
edges, in-degree percentiles and maximum, edge label homophily and, for every P, the METIS halo
ratio: the mean over parts of the rows a part sends to its peers per layer (the sum of its send
list lengths), divided by N / P. On a symmetric graph the rows part ``p`` sends to ``q`` are the
rows ``q`` receives from ``p``, so this is the partition report's "rows exchanged per layer" (the
total halo rows, ``partition/report.py``) divided by N. METIS runs as ``fullgraph partition``
runs it (:func:`fullgraph.partition.assign.assign_parts`, seed 0), without writing parts.
Graphs with unlabelled nodes (``papers``) add the labelled fraction and the labelled
nodes' clustering (:func:`labelled_neighbour_share`); homophily counts edges between labelled
nodes only. ``--accuracy`` adds test accuracy of a 2-layer GCN and of a feature-only MLP
(hidden 64, Adam 0.01, weight decay 5e-4, dropout 0.5, best validation over ``--epochs``).

Rows go to ``bench/results/synthetic_stats.csv`` (long format, ``bench/common.py``).

Usage::

    python -m bench.synthetic_stats --presets arxiv arxiv-stress --parts 4 8 --accuracy
    python -m bench.synthetic_stats --presets products --parts 4        # ~10 GiB, minutes
    python -m bench.synthetic_stats --dataset arxiv-synth --root /tmp/fg-data
    python -m bench.synthetic_stats --presets papers --scale 0.0078125 --parts   # degrees only
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bench.common import CSVWriter

RESULTS = Path(__file__).resolve().parent / "results"

#: Degree percentiles reported.
PERCENTILES = (50, 90, 99, 99.9)


def halo_ratio(indptr: np.ndarray, indices: np.ndarray, owner: np.ndarray) -> float:
    """Total halo rows over all parts divided by N (= mean rows sent per part / (N/P)).

    Args:
        indptr: CSR row pointers of incoming edges, [N + 1].
        indices: CSR sources, [nnz].
        owner: part of every node, [N].

    Returns:
        The number of distinct (receiving part, foreign source) pairs, divided by N.
    """
    n = owner.shape[0]
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    src = indices.astype(np.int64, copy=False)
    cut = owner[dst] != owner[src]
    pairs = np.unique(owner[dst[cut]] * n + src[cut])
    return pairs.shape[0] / n


def degree_stats(indptr: np.ndarray) -> dict[str, float]:
    """Mean, maximum and :data:`PERCENTILES` of the in-degrees."""
    deg = np.diff(indptr)
    stats = {"mean": float(deg.mean()), "max": float(deg.max())}
    for p, v in zip(PERCENTILES, np.percentile(deg, PERCENTILES), strict=True):
        stats[f"p{p:g}"] = float(v)
    return stats


def homophily(graph: object) -> float:
    """Fraction of (directed) edges whose ends carry the same label, among the edges whose
    ends are both labelled (every edge when every node is)."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    a, b = graph.y[dst], graph.y[graph.indices]
    both = (a >= 0) & (b >= 0)
    return float((a[both] == b[both]).mean())


def labelled_neighbour_share(graph: object) -> float:
    """Over the edges into labelled nodes, the fraction whose source is labelled too: the
    labelled nodes' clustering, against the labelled fraction for labels placed at random."""
    labelled = graph.y >= 0
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return float(labelled[graph.indices[labelled[dst]]].mean())


def accuracy(graph: object, use_graph: bool, epochs: int, seed: int = 0) -> float:
    """Test accuracy at the best validation epoch of a 2-layer GCN (or MLP when not use_graph).

    Args:
        graph: a :class:`fullgraph.datasets.graph.Graph` with features and masks.
        use_graph: aggregate with the symmetric-normalised adjacency (with self-loops).
        epochs: training epochs (full batch, evaluated every 5).
        seed: torch seed.

    Returns:
        Test accuracy in [0, 1].
    """
    import scipy.sparse as sp
    import torch

    torch.manual_seed(seed)
    n = graph.num_nodes
    a = sp.csr_matrix(
        (np.ones(graph.indices.shape[0], dtype=np.float32), graph.indices, graph.indptr),
        shape=(n, n),
    ) + sp.eye(n, dtype=np.float32, format="csr")
    d = np.asarray(a.sum(axis=1)).ravel() ** -0.5
    a = (sp.diags(d) @ a @ sp.diags(d)).tocoo()
    adj = torch.sparse_coo_tensor(
        np.vstack([a.row, a.col]).astype(np.int64), a.data, (n, n), check_invariants=True
    ).coalesce()
    x, y = torch.from_numpy(graph.x), torch.from_numpy(graph.y)
    masks = [torch.from_numpy(m) for m in (graph.train_mask, graph.val_mask, graph.test_mask)]
    lin1 = torch.nn.Linear(x.shape[1], 64)
    lin2 = torch.nn.Linear(64, graph.num_classes)
    opt = torch.optim.Adam(
        list(lin1.parameters()) + list(lin2.parameters()), lr=0.01, weight_decay=5e-4
    )

    def forward(train: bool) -> torch.Tensor:
        h = lin1(torch.nn.functional.dropout(x, 0.5, train))
        h = adj @ h if use_graph else h
        h = lin2(torch.nn.functional.dropout(torch.relu(h), 0.5, train))
        return adj @ h if use_graph else h

    best_val, best_test = -1.0, 0.0
    for epoch in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(forward(True)[masks[0]], y[masks[0]]).backward()
        opt.step()
        if epoch % 5 == 4 or epoch == epochs - 1:
            with torch.no_grad():
                pred = forward(False).argmax(1)
            val = (pred[masks[1]] == y[masks[1]]).float().mean().item()
            if val > best_val:
                best_val = val
                best_test = (pred[masks[2]] == y[masks[2]]).float().mean().item()
    return best_test


def measure(graph: object, name: str, args: argparse.Namespace, out: CSVWriter) -> None:
    """Measure one graph, print a summary line per figure and append CSV rows."""
    from fullgraph.partition.assign import assign_parts

    def row(metric: str, unit: str, x: object, y: float) -> None:
        out.write("synthetic_stats", name, metric, unit, x, y)
        print(f"{name:>18} {metric:<22} {x!s:>6} {y:12.4f} {unit}", flush=True)

    row("nodes", "nodes", "-", graph.num_nodes)
    row("undirected_edges", "edges", "-", graph.indices.shape[0] // 2)
    for key, value in degree_stats(graph.indptr).items():
        row("in_degree", "edges", key, value)
    row("edge_homophily", "fraction", "-", homophily(graph))
    if (graph.y < 0).any():  # unlabelled nodes: how many are labelled, and how they cluster
        row("labelled_fraction", "fraction", "-", float((graph.y >= 0).mean()))
        row("labelled_neighbour_share", "fraction", "-", labelled_neighbour_share(graph))
    for p in args.parts:
        t0 = time.perf_counter()
        notes: list[str] = []
        owner = assign_parts(graph, p, "metis", seed=0, notes=notes, metis=args.metis)
        seconds = time.perf_counter() - t0
        print(f"{name:>18} P={p}: {notes[0]}", flush=True)
        row("metis_halo_ratio", "rows/(N/P)", p, halo_ratio(graph.indptr, graph.indices, owner))
        row("metis_time", "s", p, seconds)
        del owner
    if args.accuracy:
        import torch

        torch.set_num_threads(args.threads)
        row("test_accuracy_mlp", "fraction", args.epochs, accuracy(graph, False, args.epochs))
        row("test_accuracy_gcn", "fraction", args.epochs, accuracy(graph, True, args.epochs))


def main() -> None:
    """Parse arguments and measure every preset / dataset named."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="*", default=[], help="synthetic presets to generate")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--scale", type=float, default=1.0, help="--presets at this scale")
    parser.add_argument("--dataset", help="a dataset on disk instead (with --root)")
    parser.add_argument("--root", type=Path, help="dataset root for --dataset")
    parser.add_argument("--parts", type=int, nargs="*", default=[4, 8], help="METIS P values")
    parser.add_argument(
        "--metis",
        choices=["auto", "libmetis", "pymetis"],
        default="auto",
        help="METIS library (as `fullgraph partition --metis`; default auto)",
    )
    parser.add_argument("--accuracy", action="store_true", help="also train GCN and MLP")
    parser.add_argument("--epochs", type=int, default=100, help="epochs for --accuracy")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for --accuracy")
    parser.add_argument("--out", type=Path, default=RESULTS / "synthetic_stats.csv")
    args = parser.parse_args()
    if not args.presets and not args.dataset:
        parser.error("give --presets and/or --dataset")
    out = CSVWriter(args.out)
    for preset in args.presets:
        from fullgraph.datasets.synthetic import generate

        graph = generate(preset, seed=args.seed, scale=args.scale)
        tag = "" if args.scale == 1 else f"@{args.scale:g}"
        measure(graph, f"synth-{preset}{tag}", args, out)
        del graph
    if args.dataset:
        from fullgraph.datasets import load

        measure(load(args.dataset, args.root), args.dataset, args, out)
    print(f"rows appended to {args.out}")


if __name__ == "__main__":
    main()
