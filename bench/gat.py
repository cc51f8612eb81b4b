"""Benchmark of the GAT layer: our one-process training epoch against PyG ``GATConv``'s.

Same arxiv-sized synthetic graph (``fullgraph data synth --preset arxiv``), same model (3 layers,
hidden 64 x 4 heads concatenated, 1 averaged output head, ReLU, dropout 0.5 on the input and
between layers, attention dropout 0.5), same threads; each side runs in its own process so that
its peak memory is its own. An epoch is one training step (forward, backward, Adam); the median
of ``--epochs`` timed epochs after ``--warmup`` is reported, with the ratio ours / PyG (target
<= 0.5) and the peak RSS of both processes (as measured, and above the process's RSS before the
graph was loaded).

Usage: ``python -m bench.gat [--root /tmp/fg-data] [--epochs 5] [--threads 1] [--out
bench/results]``; the graph is generated under ``--root`` when missing. Appends long-format rows
to ``OUT/gat.csv`` (bench/common.py).
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from pathlib import Path

from bench import pyg_baseline
from bench.child import bench_command, child_env, emit_result, run_child
from bench.common import CSVWriter, setup_threads

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, HEADS, LAYERS, DROPOUT = 64, 4, 3, 0.5


def worker_ours(a: argparse.Namespace) -> None:
    """Time our GAT train step on the whole graph; print the ``RESULT`` line."""
    from fullgraph.datasets.registry import load
    from fullgraph.distributed import Communicator
    from fullgraph.partition import whole_graph_part
    from fullgraph.resources import current_rss_mb, peak_rss_mb
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    setup_threads(a.threads)
    base_rss = current_rss_mb()
    part = whole_graph_part(load(a.dataset, a.root))
    cfg = TrainConfig(
        model="gat",
        layers=LAYERS,
        hidden=HIDDEN,
        heads=HEADS,
        output_heads=1,
        dropout=DROPOUT,
        attention_dropout=DROPOUT,
        weight_decay_scope="all",
    )
    tr = Trainer(part, Communicator(), cfg, RunOptions(quiet=True))
    times = []
    for epoch in range(1, a.warmup + a.epochs + 1):
        step = tr.train_step(epoch)
        if epoch > a.warmup:
            times.append(step.seconds)
    res = {
        "step_s": statistics.median(times),
        "peak_rss_mb": peak_rss_mb(),
        "base_rss_mb": base_rss,
    }
    emit_result(res)


def worker_pyg(a: argparse.Namespace) -> None:
    """Time the same model built from PyG ``GATConv`` layers; print the ``RESULT`` line."""
    build = partial(
        pyg_baseline.gat_layers, hidden=HIDDEN, heads=HEADS, layers=LAYERS, dropout=DROPOUT
    )
    res = pyg_baseline.measure(
        a.dataset,
        a.root,
        a.threads,
        build,
        adjacency="edge_index",
        dropout=DROPOUT,
        input_dropout=DROPOUT,
        weight_decay=5e-4,
        warmup=a.warmup,
        epochs=a.epochs,
    )
    emit_result(res)


def _ensure_data(root: str, dataset: str, preset: str) -> None:
    """Generate ``dataset`` (synthetic ``preset``) under ``root`` when missing."""
    if not (Path(root) / dataset.replace("-", "_")).is_dir():
        from fullgraph.datasets.synthetic import generate, write_ogb

        write_ogb(generate(preset, seed=0), root, dataset)
    from fullgraph.datasets.registry import load

    load(dataset, root)  # parses the raw files once, so the workers read the .npy cache


def main() -> None:
    """Run both workers, print the figures, append CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=("ours", "pyg"))
    ap.add_argument("--root", default="/tmp/fg-data", help="dataset root")
    ap.add_argument("--dataset", default="arxiv-synth", help="dataset name under --root")
    ap.add_argument("--preset", default="arxiv", help="synthetic preset when the data is missing")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs per side")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()
    if a.worker == "ours":
        return worker_ours(a)
    if a.worker == "pyg":
        return worker_pyg(a)
    _ensure_data(a.root, a.dataset, a.preset)
    common = ["--root", a.root, "--dataset", a.dataset, "--threads", str(a.threads)]
    common += ["--epochs", str(a.epochs), "--warmup", str(a.warmup)]
    env = child_env(
        {
            "OMP_WAIT_POLICY": "PASSIVE",
            "OMP_NUM_THREADS": str(a.threads),
            "THP_MEM_ALLOC_ENABLE": "1",
        }
    )
    runs = {
        name: run_child(bench_command("gat", "--worker", name, *common), env=env, echo=True)
        for name in ("pyg", "ours")
    }
    ratio = runs["ours"]["step_s"] / runs["pyg"]["step_s"]
    writer = CSVWriter(Path(a.out) / "gat.csv")
    what = f"gat {LAYERS}x{HIDDEN}x{HEADS} epoch, {a.dataset}"
    for name, res in runs.items():
        provider = "fullgraph" if name == "ours" else "pyg GATConv"
        writer.write(what, provider, "epoch_s", "s", a.threads, res["step_s"])
        writer.write(what, provider, "peak_rss", "MiB", a.threads, res["peak_rss_mb"])
        net = res["peak_rss_mb"] - res["base_rss_mb"]
        writer.write(what, provider, "peak_rss_net", "MiB", a.threads, net)
    writer.write(what, "fullgraph / pyg", "epoch_ratio", "x", a.threads, ratio)
    print(f"\n{what}, {a.threads} thread(s)")
    print(f"{'':12}{'epoch s':>10}{'peak MiB':>10}{'net MiB':>10}")
    for name, res in runs.items():
        net = res["peak_rss_mb"] - res["base_rss_mb"]
        print(f"{name:12}{res['step_s']:10.3f}{res['peak_rss_mb']:10.0f}{net:10.0f}")
    verdict = "met" if ratio <= 0.5 else "MISSED"
    print(f"ratio ours / PyG: {ratio:.3f} (target <= 0.5, {verdict})")
    print(f"rows appended to {writer.path}")


if __name__ == "__main__":
    main()
