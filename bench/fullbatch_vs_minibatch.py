"""Full-batch against mini-batch (neighbour sampling) training, like for like.

Same datasets, same ranks, same model (GraphSAGE mean, 3 layers, ``--hidden``), same
evaluation (full-graph inference, test accuracy at the best validation epoch), same logging.
For every (dataset, P, method) it runs the real command:

- full-batch: ``fullgraph partition --parts P`` once (or reuses ``--parts-root``), then
  ``mpirun -n P fullgraph train --parts DIR --model sage ...`` with its exact levers on:
  receptive-field pruning (``--prune auto``, the default), evaluation every
  ``fb_eval_every`` epochs, the learning rate of :data:`SETTINGS`; ``full-batch int8`` adds
  int8 halo compression both ways; ``full-batch unpruned`` (``--prune off``, a few epochs)
  measures what pruning saves per epoch;
- mini-batch: ``mpirun -n P fullgraph minibatch --fanouts 15,10,5 ...``;

and reports, from the JSON logs: time to reach the target test accuracy (98% of the best
final test accuracy of the full-length runs on that dataset), training time only and with the
evaluations it ran, median epoch time, final test accuracy and peak memory per rank. One chart
per dataset plots test accuracy against cumulative training time for every run.

    python -m bench.fullbatch_vs_minibatch [--datasets arxiv-synth,coauthor-physics,...]
    python -m bench.fullbatch_vs_minibatch --datasets products-synth --ranks 4 --hidden 256 \
        --methods full-batch,full-batch unpruned,mini-batch
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from bench.child import run_checked
from bench.common import CSVWriter, command_line
from bench.plot import LinePanel, Series, save_figure

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHARED = REPO.parent / "shared" / "datasets"

#: Per dataset: mini-batch size (the Shchur splits train on 20 nodes per class, so a small
#: batch gives several steps per epoch), epoch budgets and Adam learning rates of each method
#: (tuned briefly on this machine so that both methods converge within the budget), and how
#: often full-batch evaluates (default every epoch).
SETTINGS = {
    "arxiv-synth": {
        "batch_size": 1024,
        "fb_epochs": 80,
        "mb_epochs": 2,
        "fb_lr": 0.01,
        "mb_lr": 0.003,
    },
    # products size (2.45M nodes, 124M edges): P=4 on this 2-core machine; full-batch
    # evaluates every 3 epochs (a full-graph inference costs about half a training step)
    "products-synth": {
        "batch_size": 1024,
        "fb_epochs": 30,
        "mb_epochs": 3,
        "fb_lr": 0.01,
        "mb_lr": 0.003,
        "fb_eval_every": 3,
    },
    "coauthor-physics": {
        "batch_size": 32,
        "fb_epochs": 12,
        "mb_epochs": 8,
        "fb_lr": 0.005,
        "mb_lr": 0.005,
    },
    "amazon-computers": {
        "batch_size": 64,
        "fb_epochs": 80,
        "mb_epochs": 60,
        "fb_lr": 0.005,
        "mb_lr": 0.002,
    },
}


#: Methods run for a few epochs to compare epoch times (they do not set the target).
SHORT = {"full-batch unpruned"}

#: Synthetic datasets and their presets: found under ``--synth-root`` or generated.
SYNTHETIC = {"arxiv-synth": "arxiv", "products-synth": "products"}


def prepare_root(root: Path, names: list[str], synth_root: Path) -> dict[str, Path]:
    """Dataset roots: shared raw files linked into ``root``; synthetic ones found in
    ``synth_root`` (``--synth-root``) or generated."""
    roots = {}
    for name in names:
        if name in SYNTHETIC:
            d = name.replace("-", "_")
            if (synth_root / d / "meta.json").is_file():
                roots[name] = synth_root
            else:
                if not (root / d / "meta.json").is_file():
                    run(
                        [
                            str(BIN / "fullgraph"),
                            "data",
                            "synth",
                            "--preset",
                            SYNTHETIC[name],
                            "--name",
                            name,
                            "--root",
                            str(root),
                        ],
                        600,
                    )
                roots[name] = root
            continue
        d = name.replace("-", "_")
        raw = SHARED / d / "raw"
        if not raw.is_dir():
            raise SystemExit(f"{raw} not found: cannot benchmark {name}")
        (root / d).mkdir(parents=True, exist_ok=True)
        if not (root / d / "raw").exists():
            (root / d / "raw").symlink_to(raw)
        roots[name] = root
    return roots


def run(cmd: list[str], timeout: float) -> float:
    """Run ``cmd`` (its output shown only when it fails, :class:`bench.child.ChildFailed`);
    return its wall time."""
    t0 = time.perf_counter()
    run_checked(cmd, timeout=timeout)
    return time.perf_counter() - t0


def launcher(ranks: int) -> list[str]:
    """``mpirun -n P`` for P > 1, nothing for one process."""
    return [str(BIN / "mpirun"), "-n", str(ranks)] if ranks > 1 else []


def read_log(path: Path) -> tuple[list[dict], dict]:
    """Epoch records and the final record of a JSONL log."""
    recs = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    return [r for r in recs if "epoch" in r and not r.get("final")], recs[-1]


def summarise(epochs: list[dict], final: dict, target: float) -> dict[str, float]:
    """Time to target (training only, and with evaluation), median epoch time, final accuracy
    and peak memory of one run."""
    elapsed, wall, to_target, wall_to_target = 0.0, 0.0, float("nan"), float("nan")
    for rec in epochs:
        elapsed += rec["epoch_s"]
        wall += rec["epoch_s"] + rec.get("eval_s", 0.0)
        if "test_acc" in rec and rec["test_acc"] >= target and to_target != to_target:
            to_target, wall_to_target = elapsed, wall
    return {
        "time_to_target_s": to_target,
        "wall_to_target_s": wall_to_target,
        "median_epoch_s": final["median_epoch_s"],
        "final_test_acc": final["test_acc"],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in epochs),
        "train_time_s": elapsed,
    }


def curve(epochs: list[dict]) -> tuple[list[float], list[float]]:
    """(cumulative training seconds, test accuracy) at every evaluated epoch."""
    xs, ys, t = [], [], 0.0
    for rec in epochs:
        t += rec["epoch_s"]
        if "test_acc" in rec:
            xs.append(t)
            ys.append(rec["test_acc"])
    return xs, ys


def plot(dataset: str, runs: dict, target: float, out: Path) -> None:
    """Test accuracy against training time, every (method, P) on one chart."""
    series = []
    for (method, ranks), (epochs, _) in sorted(runs.items()):
        style = {"full-batch": "-", "full-batch int8": "-."}.get(method, "--")
        series.append(Series(f"{method}, P={ranks}", *curve(epochs), style=style, marker="."))
    panel = LinePanel(
        f"{dataset}: full-batch vs mini-batch GraphSAGE",
        series,
        xlabel="training time (s, evaluation excluded)",
        ylabel="test accuracy",
        hlines=[(target, f"target {target:.3f}")],
    )
    save_figure([panel], out, dpi=120)


def main() -> int:
    """Run every (dataset, P, method), then write CSV rows, charts and a summary table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(SETTINGS))
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--fanouts", default="15,10,5", help="also fixes the layer count")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads per rank (default 1: on a shared 2-core machine OpenMP barriers of "
        "multi-threaded ranks stall whenever another process takes a core)",
    )
    ap.add_argument("--epoch-scale", type=float, default=1.0, help="multiply epoch budgets")
    ap.add_argument(
        "--fb-eval-every",
        type=int,
        default=None,
        help="full-batch evaluates every N epochs (default: the dataset's setting)",
    )
    ap.add_argument(
        "--synth-root",
        "--arxiv-root",
        default="/tmp/fg-data",
        help="where generated datasets are found (or generated)",
    )
    ap.add_argument(
        "--parts-root",
        default=None,
        help="reuse (or write and keep) partitions DIR/<dataset>-<P> (default: partition into "
        "the work directory and delete the parts at the end)",
    )
    ap.add_argument(
        "--short-epochs",
        type=int,
        default=3,
        help="epochs of the epoch-time-only methods (full-batch unpruned)",
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument(
        "--methods",
        default="full-batch,full-batch int8,mini-batch",
        help="which methods to run (full-batch int8 = int8 halo compression both ways, P > 1; "
        "full-batch unpruned = --prune off for --short-epochs epochs: what receptive-field "
        "pruning saves per epoch, not part of the target)",
    )
    ap.add_argument("--reuse", action="store_true", help="reuse complete logs of earlier runs")
    ap.add_argument(
        "--precision", default="32", help="--precision of every run (32, bf16-mixed; default 32)"
    )
    ap.add_argument(
        "--fb-flags",
        default="",
        help="more `fullgraph train` flags for the full-batch runs (after the dataset's "
        "--lr: they win), e.g. the recipe of bench.recipe_sweep: --fb-flags='--dropout 0.2'",
    )
    args = ap.parse_args()
    out = Path(args.out)
    work = out / "fullbatch_vs_minibatch"
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.datasets.split(",") if n]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown dataset(s) {unknown}; known: {', '.join(SETTINGS)}")
    ranks_list = [int(r) for r in args.ranks.split(",")]
    methods = {m.strip() for m in args.methods.split(",")}
    roots = prepare_root(work / "data", names, Path(args.synth_root))
    layers = len(args.fanouts.split(","))
    model = ["--hidden", str(args.hidden), "--dropout", "0.5", "--input-dropout", "0"]
    model += ["--weight-decay", "0", "--seed", "0", "--threads", str(args.threads), "--quiet"]
    model += ["--precision", args.precision]
    csv = CSVWriter(out / "fullbatch_vs_minibatch.csv")
    env_note = f"{os.cpu_count()} cores, {args.threads} thread(s) per rank"
    table = []
    for name in names:
        s = SETTINGS[name]
        fb_epochs = max(1, round(s["fb_epochs"] * args.epoch_scale))
        mb_epochs = max(1, round(s["mb_epochs"] * args.epoch_scale))
        runs: dict = {}
        for p in ranks_list:
            parts_root = Path(args.parts_root) if args.parts_root else work / "parts"
            parts = parts_root / f"{name}-{p}"
            base = [*launcher(p), str(BIN / "fullgraph"), "train", "--parts", str(parts)]
            base += ["--model", "sage", "--layers", str(layers), "--lr", str(s["fb_lr"]), *model]
            every = args.fb_eval_every or s.get("fb_eval_every", 1)
            base += ["--eval-every", str(every), *shlex.split(args.fb_flags)]
            full = [*base, "--epochs", str(fb_epochs)]
            unpruned = [*base, "--epochs", str(args.short_epochs), "--prune", "off"]
            mini = [*launcher(p), str(BIN / "fullgraph"), "minibatch", "--dataset", name]
            mini += ["--root", str(roots[name]), "--fanouts", args.fanouts]
            mini += ["--batch-size", str(s["batch_size"]), "--lr", str(s["mb_lr"])]
            mini += ["--epochs", str(mb_epochs), *model]
            variants = [
                ("full-batch", "full", full),
                ("full-batch unpruned", "full-unpruned", unpruned),
                ("mini-batch", "mini", mini),
            ]
            if p > 1:  # halo compression only exists between ranks
                int8 = [*full, "--compress-fwd", "int8", "--compress-bwd", "int8"]
                variants.insert(1, ("full-batch int8", "full-int8", int8))
            for method, tag, cmd in variants:
                if method not in methods:
                    continue
                log = work / f"{name}-P{p}-{tag}.jsonl"
                if args.reuse and log.is_file() and '"final": true' in log.read_text():
                    print(f"[{name} P={p}] {method}: reusing {log}", flush=True)
                    runs[(method, p)] = (*read_log(log), float("nan"))
                    continue
                if tag.startswith("full") and not (parts / "meta.json").is_file():
                    part_cmd = [str(BIN / "fullgraph"), "partition", "--dataset", name]
                    part_cmd += ["--root", str(roots[name]), "--parts", str(p)]
                    run([*part_cmd, "--out", str(parts), "--force"], args.timeout)
                cmd = [*cmd, "--log-json", str(log)]
                print(f"[{name} P={p}] {method}: {' '.join(cmd)}", flush=True)
                wall = run(cmd, args.timeout)
                runs[(method, p)] = (*read_log(log), wall)
        target = 0.98 * max(
            final["test_acc"] for (m, _), (_, final, _) in runs.items() if m not in SHORT
        )
        for (method, p), (epochs, final, wall) in sorted(runs.items()):
            stats = summarise(epochs, final, target)
            units = {
                "time_to_target_s": "s",
                "wall_to_target_s": "s",
                "median_epoch_s": "s",
                "final_test_acc": "acc",
                "peak_rss_mb": "MiB",
                "train_time_s": "s",
            }
            for metric, value in stats.items():
                csv.write(
                    f"fullbatch_vs_minibatch/{name}",
                    method,
                    metric,
                    units[metric],
                    p,
                    value,
                    ranks=p,
                )
            table.append((name, method, p, target, stats, len(epochs), wall))
        plot(name, {k: v[:2] for k, v in runs.items()}, target, out / f"fbmb_{name}.png")
    print(
        f"\nGraphSAGE mean, {layers} layers, hidden {args.hidden}, fanouts {args.fanouts}; "
        f"{env_note}; target = 98% of the best final test accuracy per dataset"
    )
    print(
        f"{'dataset':18} {'method':19} {'P':>2} {'target':>7} {'to target s':>11} "
        f"{'+eval s':>8} {'median ep s':>11} {'final acc':>9} {'peak MiB':>8} {'epochs':>6} "
        f"{'wall s':>7}"
    )
    for name, method, p, target, st, n_ep, wall in table:
        print(
            f"{name:18} {method:19} {p:>2} {target:7.4f} {st['time_to_target_s']:11.2f} "
            f"{st['wall_to_target_s']:8.1f} "
            f"{st['median_epoch_s']:11.3f} {st['final_test_acc']:9.4f} "
            f"{st['peak_rss_mb']:8.0f} {n_ep:6d} {wall:7.1f}"
        )
    print(f"\nCSV: {csv.path}; charts: {out}/fbmb_<dataset>.png; logs: {work}")
    print(f"reproduce with: {command_line()}")
    if not args.parts_root:
        shutil.rmtree(work / "parts", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
