"""Partitioning benchmark: METIS's two assignments against random and contiguous, same run.

Methods: ``blocks`` (``--method metis``'s default: fixed node blocks, parts as runs of whole
blocks, the partition bit-identical training needs), ``kway`` (k-way METIS into P parts,
``--assign kway``), ``random`` and ``contiguous``. For every method and P it starts one
subprocess (so that peak memory is that run's alone), which loads the dataset memory-mapped (as
``fullgraph partition`` does), partitions it into a temporary directory and reports: total halo
rows (rows exchanged per layer), edge cut, imbalance of nodes / train nodes / edges,
partitioning time (without loading) and the process's peak RSS (loading included, so an upper
bound) beside the graph's bytes. Rows go to ``bench/results/partition.csv`` (long format,
``bench/common.py``) and a plot to ``bench/results/partition.png``; with ``blocks`` and
``kway`` both run, the price of the blocks (their halo rows and edge cut over k-way's) is
printed per P.

Usage::

    python -m bench.partition --dataset arxiv-synth --root /tmp/fg-data          # P = 2, 4, 8
    python -m bench.partition --dataset coauthor-physics --root ROOT --methods blocks kway
    python -m bench.partition --products --dataset products-synth --root /tmp/fg-data
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.child import bench_command, emit_result, run_checked, run_child
from bench.common import CSVWriter, command_line
from bench.plot import LinePanel, Series, save_figure

RESULTS = Path(__file__).resolve().parent / "results"

#: (metric, unit, key into a worker's result) of every CSV row per run.
METRICS = [
    ("halo_rows", "rows", "rows_exchanged_per_layer"),
    ("edge_cut", "edges", "edge_cut"),
    ("imbalance_nodes", "max/mean", "imbalance_nodes"),
    ("imbalance_train", "max/mean", "imbalance_train"),
    ("imbalance_edges", "max/mean", "imbalance_edges"),
    ("partition_time", "s", "seconds"),
    ("peak_rss", "MiB", "peak_rss_mb"),
    ("peak_over_graph", "x", "peak_over_graph"),
]

#: benchmark method -> (``--method``, ``--assign``) of ``fullgraph partition``.
METHODS = {
    "blocks": ("metis", "blocks"),
    "kway": ("metis", "kway"),
    "random": ("random", None),
    "contiguous": ("contiguous", None),
}


def worker(args: argparse.Namespace) -> None:
    """Load, partition into a temporary directory, print the ``RESULT`` line."""
    from fullgraph.datasets import load
    from fullgraph.datasets.graph import GRAPH_ARRAYS
    from fullgraph.partition import partition_graph
    from fullgraph.resources import peak_rss_mb

    graph = load(args.dataset, args.root, mmap=True)
    graph_mb = sum(getattr(getattr(graph, k, None), "nbytes", 0) for k in GRAPH_ARRAYS) / 2**20
    load_peak = peak_rss_mb()
    method, assign = METHODS[args.method]
    with tempfile.TemporaryDirectory(prefix="fg-bench-part-") as tmp:
        t0 = time.perf_counter()
        meta = partition_graph(graph, args.parts, Path(tmp) / "p", method, args.seed, assign=assign)
        seconds = time.perf_counter() - t0
    rep = meta["report"]
    result = {
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "graph_mb": round(graph_mb, 1),
        "peak_over_graph": round(peak_rss_mb() / graph_mb, 3),
        "num_blocks": meta.get("num_blocks"),
        "load_peak_rss_mb": round(load_peak, 1),
        "rows_exchanged_per_layer": rep["rows_exchanged_per_layer"],
        "edge_cut": rep["edge_cut"],
        "stages": rep["stages"],
        "notes": rep["notes"],
        "num_nodes": meta["num_nodes"],
        "num_edges": meta["num_edges"],
        **{f"imbalance_{k}": v for k, v in rep["imbalance"].items()},
    }
    emit_result(result)


def run_one(args: argparse.Namespace, method: str, parts: int) -> dict:
    """Run :func:`worker` in a fresh interpreter; its result."""
    cmd = bench_command(
        "partition",
        "--worker",
        "--dataset",
        args.dataset,
        "--root",
        str(args.root),
        "--method",
        method,
        "--seed",
        str(args.seed),
        "--parts-one",
        str(parts),
    )
    return run_child(cmd)


def plot(results: dict, what: str, path: Path) -> None:
    """Four panels against P: halo rows, worst imbalance, time, peak RSS; one line per method."""
    figures = [
        ("total halo rows (per layer)", lambda r: r["rows_exchanged_per_layer"]),
        (
            "worst imbalance (nodes/train/edges)",
            lambda r: max(r["imbalance_nodes"], r["imbalance_train"], r["imbalance_edges"]),
        ),
        ("partition time (s)", lambda r: r["seconds"]),
        ("peak RSS incl. load (MiB)", lambda r: r["peak_rss_mb"]),
    ]
    ticks = sorted({p for by_p in results.values() for p in by_p})
    panels = [
        LinePanel(
            title,
            [
                Series(m, sorted(by_p), [get(by_p[p]) for p in sorted(by_p)])
                for m, by_p in results.items()
            ],
            xlabel="parts P",
            xticks=ticks,
            legend=i == 0,
        )
        for i, (title, get) in enumerate(figures)
    ]
    save_figure(panels, path, panel_size=(4.0, 3.8), title=what)


def main() -> None:
    """Parse options, run every (method, P), write CSV and plot, print the targets."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="arxiv-synth", help="dataset name")
    parser.add_argument("--root", type=Path, default=Path("/tmp/fg-data"), help="dataset root")
    parser.add_argument("--parts", type=int, nargs="+", default=[2, 4, 8], help="values of P")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        default=list(METHODS),
        help="methods (default all: blocks kway random contiguous)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--products",
        action="store_true",
        help="products-like run: METIS's blocks and k-way into 8 parts only (give --dataset "
        "of that graph)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="CSV and PNG directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parts-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.parts = args.parts_one
        worker(args)
        return
    if args.products:
        args.parts, args.methods = [8], ["blocks", "kway"]
    stem = "partition-products" if args.products else "partition"
    csv = CSVWriter(args.out_dir / f"{stem}.csv")
    what = f"partition/{args.dataset}"
    # Load once first so that the dataset's processed cache exists and every run below
    # measures the same (cached) load, not the first CSV parse.
    warm = f"from fullgraph.datasets import load; load({args.dataset!r}, {str(args.root)!r})"
    run_checked([sys.executable, "-c", warm])
    results: dict[str, dict[int, dict]] = {}
    for parts in args.parts:
        for method in args.methods:
            r = run_one(args, method, parts)
            results.setdefault(method, {})[parts] = r
            for metric, unit, key in METRICS:
                csv.write(what, method, metric, unit, parts, r[key], ranks=parts)
            print(
                f"{method:>10} P={parts}: halo rows {r['rows_exchanged_per_layer']:>9,}  "
                f"edge cut {r['edge_cut']:>10,}  imbalance nodes {r['imbalance_nodes']:.3f} "
                f"train {r['imbalance_train']:.3f} edges {r['imbalance_edges']:.3f}  "
                f"time {r['seconds']:7.2f} s  peak {r['peak_rss_mb']:7.0f} MiB "
                f"({r['peak_over_graph']:.2f}x the graph; load {r['load_peak_rss_mb']:.0f})"
                + (f"  notes: {r['notes']}" if r["notes"] else "")
            )
    png = args.out_dir / f"{stem}.png"
    plot(results, f"{what} ({r['num_nodes']:,} nodes, {r['num_edges']:,} edges)", png)
    print(f"wrote {csv.path} and {png}")
    blocks, kway = results.get("blocks", {}), results.get("kway", {})
    for parts in sorted(set(blocks) & set(kway)):
        b, k = blocks[parts], kway[parts]
        print(
            f"price of the blocks P={parts} ({b['num_blocks']} blocks): halo rows "
            f"{b['rows_exchanged_per_layer'] / k['rows_exchanged_per_layer']:.3f}x k-way, edge "
            f"cut {b['edge_cut'] / k['edge_cut']:.3f}x (target <= 1.10), time "
            f"{b['seconds'] / k['seconds']:.2f}x, peak {b['peak_over_graph']:.2f}x the graph "
            "(target <= 3)"
        )
    metis = results.get("blocks", {})
    if 4 in metis and 4 in results.get("random", {}):
        ratio = (
            metis[4]["rows_exchanged_per_layer"] / results["random"][4]["rows_exchanged_per_layer"]
        )
        print(f"target: METIS halo rows at P=4 / random = {ratio:.3f} (<= 0.3)")
    for parts, r in sorted(metis.items()):
        worst = max(r["imbalance_nodes"], r["imbalance_train"], r["imbalance_edges"])
        print(
            f"target: METIS P={parts} worst imbalance {worst:.3f} (<= 1.05), time "
            f"{r['seconds']:.2f} s, peak {r['peak_rss_mb'] / 1024:.2f} GiB"
            + ("" if args.products else " (arxiv-like: < 20 s, < 2 GiB)")
        )
    print(f"reproduce: {command_line()}")


if __name__ == "__main__":
    main()
