"""The receptive-field cut's sizes, and what it buys a training step.

For every dataset and number of hops L, the cut of :mod:`fullgraph.partition.receptive_cut`
around the labelled nodes (train/val/test, and train alone): the nodes and edges it keeps (share
of the whole graph) and the seconds the cut takes. With ``--train-epochs N``, one process trains
the same model (``--model``, ``--layers`` = L, ``--hidden``, dropout 0.5) for N steps on the
whole graph and on its cut (both one part with blocks): the median step time of each, their
ratio, the peak RSS of each in its own subprocess, and whether every loss is the same bits
(it must be: the cut is exact).

Rows go to ``bench/results/receptive_cut.csv`` (long format, ``bench/common.py``); the table is
printed with the command that reproduces it.

Usage::

    python -m bench.receptive_cut --datasets cora citeseer pubmed --hops 1 2 3
    fullgraph data synth --preset arxiv --name arxiv-synth --root /tmp/fg-data
    python -m bench.receptive_cut --datasets arxiv-synth --root /tmp/fg-data --hops 2 \\
        --train-epochs 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.child import bench_command, emit_result, run_child
from bench.common import CSVWriter, command_line, setup_threads

RESULTS = Path(__file__).resolve().parent / "results"
#: the real datasets beside the checkout, linked into a temporary root (never written there)
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
SPLITS = {"labelled": ("train", "val", "test"), "train": ("train",)}


def root_for(name: str, root: Path | None, work: Path) -> Path:
    """``root`` when it holds ``name``, else a root under ``work`` linking its shared raw data."""
    from fullgraph.datasets.paths import dataset_dir

    if root is not None and dataset_dir(root, name).exists():
        return root
    src = dataset_dir(SHARED, name) / "raw"
    if not src.is_dir():
        raise SystemExit(f"{name}: not under --root {root} and not a shared dataset ({src})")
    d = dataset_dir(work, name)
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "raw").exists():
        (d / "raw").symlink_to(src, target_is_directory=True)
    return work


def train_worker(args: argparse.Namespace) -> None:
    """One process: partition (one part, blocks; cut or not) and time ``--train-epochs``
    steps; print the ``RESULT`` line (step times, losses as hex, peak RSS)."""
    from fullgraph.datasets import load
    from fullgraph.distributed.communicator import Communicator
    from fullgraph.partition import load_partition, partition_graph
    from fullgraph.partition.receptive_cut import CutSpec
    from fullgraph.resources import peak_rss_mb
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    setup_threads(args.threads)
    graph = load(args.dataset, args.root)
    cut = CutSpec(args.layers, SPLITS[args.split]) if args.cut else None
    with tempfile.TemporaryDirectory(prefix="fg-bench-cut-") as tmp:
        partition_graph(graph, 1, Path(tmp) / "p", cut=cut)
        del graph
        part = load_partition(Path(tmp) / "p", 0)
        cfg = TrainConfig(
            model=args.model, layers=args.layers, hidden=args.hidden, dropout=0.5, seed=0
        )
        trainer = Trainer(part, Communicator(), cfg, RunOptions(quiet=True))
        seconds, losses = [], []
        for epoch in range(1, args.train_epochs + 1):
            t0 = time.perf_counter()
            losses.append(float(trainer.train_step(epoch).loss).hex())
            seconds.append(time.perf_counter() - t0)
    emit_result({"seconds": seconds, "losses": losses, "peak_rss_mb": round(peak_rss_mb(), 1)})


def sizes(name: str, root: Path, hops: list[int], csv: CSVWriter) -> None:
    """Print and write the cut's sizes for every hop count and split set."""
    from fullgraph.datasets import load
    from fullgraph.partition.receptive_cut import CutSpec, cut_graph

    graph = load(name, root)
    for label, splits in SPLITS.items():
        for L in hops:
            t0 = time.perf_counter()
            rec = cut_graph(graph, CutSpec(L, splits)).record
            took = time.perf_counter() - t0
            nodes = rec["num_nodes"] / graph.num_nodes
            edges = rec["num_edges"] / max(1, graph.num_edges)
            for metric, unit, value in (
                ("kept_nodes", "share", nodes),
                ("kept_edges", "share", edges),
                ("cut_time", "s", took),
            ):
                csv.write(f"receptive_cut/{name}", label, metric, unit, L, value)
            print(
                f"| {name} | {label} ({rec['seeds']:,}) | {L} | {rec['num_nodes']:,} / "
                f"{graph.num_nodes:,} ({nodes:.1%}) | {rec['num_edges']:,} / "
                f"{graph.num_edges:,} ({edges:.1%}) | {took:.2f} |",
                flush=True,
            )


def train_pair(args: argparse.Namespace, name: str, root: Path, csv: CSVWriter) -> None:
    """Whole graph against its cut: step time, peak RSS, the same losses."""
    runs = {}
    for cut in (False, True):
        cmd = bench_command(
            "receptive_cut",
            "--worker",
            *("--dataset", name, "--root", str(root), "--model", args.model),
            *("--layers", str(args.layers), "--hidden", str(args.hidden)),
            *("--train-epochs", str(args.train_epochs), "--threads", str(args.threads)),
            *("--split", args.split, *(["--cut"] if cut else [])),
        )
        runs[cut] = run_child(cmd)
    step = {c: statistics.median(r["seconds"][1:] or r["seconds"]) for c, r in runs.items()}
    same = runs[False]["losses"] == runs[True]["losses"]
    for cut, r in runs.items():
        what = "cut" if cut else "whole"
        csv.write(f"receptive_cut/{name}", what, "step_time", "s", args.layers, step[cut])
        csv.write(f"receptive_cut/{name}", what, "peak_rss", "MiB", args.layers, r["peak_rss_mb"])
    print(
        f"| {name} | {args.model} {args.layers}x{args.hidden}, {args.split} | "
        f"{step[False] * 1e3:.1f} | {step[True] * 1e3:.1f} | {step[False] / step[True]:.2f}x | "
        f"{runs[False]['peak_rss_mb']:.0f} / {runs[True]['peak_rss_mb']:.0f} | "
        f"{'yes' if same else 'NO'} |",
        flush=True,
    )


def main() -> None:
    """Parse options; the size table, then (with ``--train-epochs``) the step table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer", "pubmed"])
    parser.add_argument("--root", type=Path, help="root of datasets not in the shared folder")
    parser.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--train-epochs", type=int, default=0, help="steps timed (0: none)")
    parser.add_argument("--model", default="gcn")
    parser.add_argument("--layers", type=int, default=2, help="layers = the cut's hops")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--split", choices=list(SPLITS), default="train", help="cut around")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="CSV directory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--cut", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        train_worker(args)
        return
    csv = CSVWriter(args.out_dir / "receptive_cut.csv")
    with tempfile.TemporaryDirectory(prefix="fg-bench-cut-root-") as work:
        roots = {n: root_for(n, args.root, Path(work)) for n in args.datasets}
        print("| dataset | cut around (nodes) | hops | nodes kept | edges kept | cut s |")
        print("|---|---|---|---|---|---|")
        for name in args.datasets:
            sizes(name, roots[name], args.hops, csv)
        if args.train_epochs:
            print(
                "\n| dataset | model, cut around | whole ms/step | cut ms/step | speed-up "
                "| peak MiB whole / cut | same losses |"
            )
            print("|---|---|---|---|---|---|---|")
            for name in args.datasets:
                train_pair(args, name, roots[name], csv)
    print(f"wrote {csv.path}")
    print(f"reproduce: {command_line()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
