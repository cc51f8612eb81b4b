"""Partitioner benchmark: METIS (its default blocks), KaMinPar (k-way) and random, same graph.

For every method and P it starts one subprocess (peak memory is that run's alone), which loads
the dataset memory-mapped, writes the parts into a temporary directory with
:func:`fullgraph.partition.partition_graph` and reports: edge cut, halo rows (summed over the
parts: rows exchanged per layer), node and training-node imbalance (max / mean), partitioning
time (without loading) and the process's peak RSS (loading included). Rows go to
``bench/results/partitioners.csv`` (long format, ``bench/common.py``); the table is printed
with the command that reproduces it.

Usage::

    fullgraph data synth --preset arxiv --name arxiv-synth --root /tmp/fg-data
    python -m bench.partitioners --dataset arxiv-synth --root /tmp/fg-data   # P = 4, 8, 16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.child import bench_command, emit_result, run_checked, run_child
from bench.common import CSVWriter, command_line

RESULTS = Path(__file__).resolve().parent / "results"

#: benchmark method -> (``--method``, ``--assign``) of ``fullgraph partition``.
METHODS = {"metis": ("metis", None), "kaminpar": ("kaminpar", None), "random": ("random", None)}

#: (metric, unit, key into a worker's result) of every CSV row per run.
METRICS = [
    ("edge_cut", "edges", "edge_cut"),
    ("halo_rows", "rows", "rows_exchanged_per_layer"),
    ("imbalance_nodes", "max/mean", "imbalance_nodes"),
    ("imbalance_train", "max/mean", "imbalance_train"),
    ("partition_time", "s", "seconds"),
    ("peak_rss", "MiB", "peak_rss_mb"),
]


def worker(args: argparse.Namespace) -> None:
    """Load, partition into a temporary directory, print the ``RESULT`` line."""
    from fullgraph.datasets import load
    from fullgraph.partition import partition_graph
    from fullgraph.resources import peak_rss_mb

    graph = load(args.dataset, args.root, mmap=True)
    method, assign = METHODS[args.method]
    with tempfile.TemporaryDirectory(prefix="fg-bench-partitioners-") as tmp:
        t0 = time.perf_counter()
        meta = partition_graph(graph, args.parts, Path(tmp) / "p", method, args.seed, assign=assign)
        seconds = time.perf_counter() - t0
    rep = meta["report"]
    emit_result(
        {
            "seconds": round(seconds, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "rows_exchanged_per_layer": rep["rows_exchanged_per_layer"],
            "edge_cut": rep["edge_cut"],
            "num_nodes": meta["num_nodes"],
            "num_edges": meta["num_edges"],
            "notes": rep["notes"],
            **{f"imbalance_{k}": v for k, v in rep["imbalance"].items()},
        }
    )


def run_one(args: argparse.Namespace, method: str, parts: int) -> dict:
    """Run :func:`worker` in a fresh interpreter; its result."""
    cmd = bench_command(
        "partitioners",
        "--worker",
        *("--dataset", args.dataset, "--root", str(args.root), "--method", method),
        *("--seed", str(args.seed), "--parts-one", str(parts)),
    )
    return run_child(cmd)


def main() -> None:
    """Parse options, run every (method, P), write the CSV, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="arxiv-synth", help="dataset name")
    parser.add_argument("--root", type=Path, default=Path("/tmp/fg-data"), help="dataset root")
    parser.add_argument("--parts", type=int, nargs="+", default=[4, 8, 16], help="values of P")
    parser.add_argument(
        "--methods", nargs="+", choices=list(METHODS), default=list(METHODS), help="methods"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="CSV directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parts-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.parts = args.parts_one
        worker(args)
        return
    csv = CSVWriter(args.out_dir / "partitioners.csv")
    what = f"partitioners/{args.dataset}"
    warm = f"from fullgraph.datasets import load; load({args.dataset!r}, {str(args.root)!r})"
    run_checked([sys.executable, "-c", warm])  # the processed cache exists before any timing
    print(
        "| P | method | edge cut | halo rows | nodes max/mean | train max/mean | time s | peak MiB"
    )
    print("|---|---|---|---|---|---|---|---|")
    for parts in args.parts:
        for method in args.methods:
            r = run_one(args, method, parts)
            for metric, unit, key in METRICS:
                csv.write(what, method, metric, unit, parts, r[key], ranks=parts)
            print(
                f"| {parts} | {method} | {r['edge_cut']:,} | {r['rows_exchanged_per_layer']:,} | "
                f"{r['imbalance_nodes']:.3f} | {r['imbalance_train']:.3f} | {r['seconds']:.2f} | "
                f"{r['peak_rss_mb']:.0f} |",
                flush=True,
            )
    print(f"graph: {r['num_nodes']:,} nodes, {r['num_edges']:,} stored edges; wrote {csv.path}")
    print(f"reproduce: {command_line()}")


if __name__ == "__main__":
    main()
