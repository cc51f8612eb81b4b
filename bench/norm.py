"""What normalisation costs and gives: GCN 3 x 256 on arxiv-synth with ``--norm none|batch|layer``.

Two measurements, one process, the whole graph, the same threads:

(a) epoch time: one trainer per variant, built side by side, their train steps interleaved
    (none, batch, layer, none, batch, ...) so the machine's noise falls on all of them alike;
    the median and the fastest step per variant and their ratios to ``none`` (on a shared
    machine the fastest is the one least disturbed); with ``--with-eval`` each timed unit is a
    whole epoch as ``fit`` runs it (the step and an evaluation);
(b) accuracy: each variant trained for ``--train-epochs`` epochs (one after another), best
    validation accuracy and the test accuracy at that epoch.

Usage: ``python -m bench.norm --root DIR [--dataset arxiv-synth] [--rounds 10]
[--train-epochs 200] [--with-eval] [--out bench/results]``. Writes ``OUT/norm.csv`` (long format,
bench/common.py). A missing arxiv-synth is generated under ``--root`` first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import CSVWriter, setup_threads

VARIANTS = ("none", "batch", "layer")


def load_part(root: str, dataset: str):
    """The whole graph as one part (generated from the arxiv preset when missing)."""
    from fullgraph.datasets.registry import load
    from fullgraph.datasets.synthetic import generate, write_ogb
    from fullgraph.errors import DataError
    from fullgraph.partition import whole_graph_part

    try:
        graph = load(dataset, root)
    except DataError:
        write_ogb(generate("arxiv"), root, dataset)
        graph = load(dataset, root)
    return whole_graph_part(graph)


def build(part, norm: str, epochs: int, seed: int):
    """A one-process GCN 3 x 256 trainer (dropout 0.5 between layers) with ``norm``."""
    from fullgraph.distributed.communicator import Communicator
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    cfg = TrainConfig(
        model="gcn",
        layers=3,
        hidden=256,
        dropout=0.5,
        input_dropout=0.0,
        norm=norm,
        epochs=epochs,
        seed=seed,
        lr=0.01,
    )
    return Trainer(part, Communicator(), cfg, RunOptions(quiet=True))


def main() -> None:
    """Interleaved epoch timing, then accuracy per variant; print and write CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="dataset root")
    ap.add_argument("--dataset", default="arxiv-synth")
    ap.add_argument("--rounds", type=int, default=10, help="timed steps per variant")
    ap.add_argument("--train-epochs", type=int, default=200, help="0 skips the accuracy runs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--norms", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument(
        "--with-eval",
        action="store_true",
        help="time whole epochs as `fullgraph train` runs them (--eval-every 1): the training "
        "step and the evaluation",
    )
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args()

    setup_threads(a.threads)  # the environment and allocator `fullgraph train` uses
    part = load_part(a.root, a.dataset)
    csv = CSVWriter(Path(a.out) / "norm.csv")
    what = f"{a.dataset} gcn 3x256" + (", epoch = step + evaluation" if a.with_eval else "")

    norms = [n for n in VARIANTS if n in a.norms]
    trainers = {norm: build(part, norm, a.rounds + 1, a.seed) for norm in norms}
    times: dict[str, list[float]] = {norm: [] for norm in norms}
    for epoch in range(1, a.rounds + 2):
        for norm, tr in trainers.items():
            t0 = time.perf_counter()
            tr.train_step(epoch)
            if a.with_eval:
                tr.evaluate()
            if epoch > 1:  # the first step warms the kernels up
                times[norm].append(time.perf_counter() - t0)
    del trainers
    base = statistics.median(times[norms[0]])
    base_min = min(times[norms[0]])
    unit = "epochs" if a.with_eval else "steps"
    print(f"{what}, {a.rounds} interleaved {unit} per variant, {a.threads} threads:")
    for norm in norms:
        step, fastest = statistics.median(times[norm]), min(times[norm])
        print(
            f"  --norm {norm:5s}: median step {step * 1e3:8.1f} ms ({step / base:.3f}x), "
            f"fastest {fastest * 1e3:8.1f} ms ({fastest / base_min:.3f}x {norms[0]})"
        )
        csv.write(what, f"norm-{norm}", "step_time", "s", norm, step)
        unit = f"x {norms[0]}"
        csv.write(what, f"norm-{norm}", "step_time_ratio", unit, norm, step / base)
        csv.write(what, f"norm-{norm}", "fastest_step_ratio", unit, norm, fastest / base_min)

    if a.train_epochs <= 0:
        return
    for norm in norms:
        tr = build(part, norm, a.train_epochs, a.seed)
        final = tr.fit()
        print(
            f"  --norm {norm:5s}: {a.train_epochs} epochs, best val {final['best_val_acc']:.4f} "
            f"(epoch {final['best_epoch']}), test at best val {final['test_acc']:.4f}"
        )
        csv.write(what, f"norm-{norm}", "best_val_acc", "", norm, final["best_val_acc"])
        csv.write(what, f"norm-{norm}", "test_acc", "", norm, final["test_acc"])


if __name__ == "__main__":
    main()
