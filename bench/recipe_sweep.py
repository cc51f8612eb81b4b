"""Full-batch steps to accuracy: a small sweep of the optimiser recipe on one graph.

Full-batch training takes one optimiser step per epoch, so the recipe (learning rate, warm-up,
schedule, normalisation) decides how many whole-graph steps reach a target accuracy; Bajaj et
al. (VLDB 2025) find each method needs its own. Every configuration is one real
``fullgraph train`` in one process (the result is the same on P ranks: training is exact), the
model fixed (GraphSAGE mean, ``--layers`` x ``--hidden``, dropout 0.5 between layers unless a
configuration sets it, none on the input, no weight decay, seed 0, evaluation every epoch).
Steps do not depend on the machine's load, so the sweep may share the machine; epoch times are
reported but are only comparable within one run.

The target is 98% of the best test accuracy (at the best validation epoch) over all
configurations, as ``bench.fullbatch_vs_minibatch`` sets it; a configuration's steps to target
is its first epoch at or above it.

    python -m bench.recipe_sweep --preset products --scale 0.1 --epochs 60 --out /tmp/sweep

Writes ``OUT/recipe_sweep.csv`` (long format) and ``OUT/recipe_sweep.png`` (test accuracy
against steps), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.child import run_checked
from bench.common import CSVWriter, median
from bench.plot import LinePanel, Series, save_figure

BIN = Path(sys.executable).parent

#: The configurations swept by default: (name, ``fullgraph train`` flags).
CONFIGS: list[tuple[str, list[str]]] = [
    ("lr 0.01", ["--lr", "0.01"]),
    ("lr 0.003", ["--lr", "0.003"]),
    ("lr 0.03", ["--lr", "0.03"]),
    ("lr 0.01 warm-up 5", ["--lr", "0.01", "--lr-warmup", "5"]),
    ("lr 0.03 warm-up 5", ["--lr", "0.03", "--lr-warmup", "5"]),
    ("lr 0.03 warm-up 5 cosine", ["--lr", "0.03", "--lr-warmup", "5", "--lr-schedule", "cosine"]),
    ("lr 0.01 layer norm", ["--lr", "0.01", "--norm", "layer"]),
    ("lr 0.03 warm-up 5 layer norm", ["--lr", "0.03", "--lr-warmup", "5", "--norm", "layer"]),
    ("lr 0.01 dropout 0.2", ["--lr", "0.01", "--dropout", "0.2"]),
    ("lr 0.01 dropout 0", ["--lr", "0.01", "--dropout", "0"]),
    ("lr 0.003 dropout 0.2", ["--lr", "0.003", "--dropout", "0.2"]),
]


def ensure_dataset(root: Path, name: str, preset: str, scale: float) -> None:
    """Write the synthetic ``preset`` graph, ``scale`` times its nodes and edges, as ``name``
    under ``root`` unless it is there."""
    if (root / name.replace("-", "_") / "meta.json").is_file():
        return
    from fullgraph.datasets.synthetic import PRESETS, generate, write_ogb

    cfg = PRESETS[preset]
    sizes = {"num_nodes": int(cfg.num_nodes * scale), "num_edges": int(cfg.num_edges * scale)}
    write_ogb(generate(preset, seed=0, **sizes), str(root), name)


def train(args: argparse.Namespace, name: str, flags: list[str], log: Path) -> list[dict]:
    """Run one configuration (skipped when its complete log exists); its per-epoch records."""
    if not _complete(log, args.epochs):
        cmd = [str(BIN / "fullgraph"), "train", "--dataset", args.dataset, "--root", args.root]
        cmd += ["--model", "sage", "--layers", str(args.layers), "--hidden", str(args.hidden)]
        cmd += ["--dropout", "0.5", "--input-dropout", "0", "--weight-decay", "0", "--seed", "0"]
        cmd += ["--epochs", str(args.epochs), "--eval-every", "1", "--threads", str(args.threads)]
        cmd += ["--precision", args.precision, "--quiet", "--force", "--log-json", str(log)]
        print(f"{name}: {' '.join(cmd[1:])}", flush=True)
        run_checked([*cmd, *flags], timeout=args.timeout)
    return _records(log)


def _records(log: Path) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if "epoch" in r]


def _complete(log: Path, epochs: int) -> bool:
    return log.is_file() and len(_records(log)) >= epochs


def best_test(records: list[dict]) -> float:
    """Test accuracy at the best validation epoch (the first such epoch)."""
    best = max(records, key=lambda r: (r["val_acc"], -r["epoch"]))
    return float(best["test_acc"])


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print and write the table and the chart."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="products", help="synthetic preset (default products)")
    ap.add_argument("--scale", type=float, default=0.1, help="fraction of its nodes and edges")
    ap.add_argument("--dataset", help="dataset name (default <preset>-synth-s<scale>)")
    ap.add_argument("--root", default="/tmp/fg-data/data", help="dataset root")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", default="32")
    ap.add_argument("--only", help="comma-separated configuration names to run (default all)")
    ap.add_argument("--timeout", type=float, default=7200)
    ap.add_argument("--out", default="/tmp/recipe-sweep")
    args = ap.parse_args(argv)
    args.dataset = args.dataset or f"{args.preset}-synth-s{args.scale:g}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ensure_dataset(Path(args.root), args.dataset, args.preset, args.scale)
    chosen = [c for c in CONFIGS if not args.only or c[0] in args.only.split(",")]
    runs = {}
    for name, flags in chosen:
        runs[name] = train(args, name, flags, out / f"{name.replace(' ', '_')}.json")
    target = 0.98 * max(best_test(r) for r in runs.values())
    csv = CSVWriter(out / "recipe_sweep.csv")
    print(f"\n{args.dataset}: target test accuracy {target:.4f} (98% of the best)")
    print("| recipe | steps to target | test at best val | best val | median epoch (s) |")
    print("|---|---|---|---|---|")
    series = []
    for name, recs in runs.items():
        steps = next((r["epoch"] for r in recs if r["test_acc"] >= target), None)
        epoch_s = median(r["epoch_s"] for r in recs)
        best_val = max(r["val_acc"] for r in recs)
        shown = "not reached" if steps is None else str(steps)
        print(f"| {name} | {shown} | {best_test(recs):.4f} | {best_val:.4f} | {epoch_s:.2f} |")
        what = f"{args.dataset} sage {args.layers}x{args.hidden}"
        if steps is not None:
            csv.write(what, name, "steps to target", "steps", args.epochs, steps)
        csv.write(what, name, "test at best val", "acc", args.epochs, best_test(recs))
        csv.write(what, name, "median epoch", "s", args.epochs, epoch_s)
        xs = [r["epoch"] for r in recs]
        series.append(Series(name, xs, [r["test_acc"] for r in recs], marker=None))
    panel = LinePanel(
        f"{args.dataset}: full-batch recipes (GraphSAGE {args.layers}x{args.hidden})",
        series,
        xlabel="optimiser steps (epochs)",
        ylabel="test accuracy",
        hlines=[(target, "target")],
    )
    print(f"wrote {save_figure([panel], out / 'recipe_sweep.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
