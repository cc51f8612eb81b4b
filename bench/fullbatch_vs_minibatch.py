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
- exact propagation (issue 34, :mod:`bench.propagation_methods`, each at its own recipe in
  ``SETTINGS[...]["recipes"]``): ``sign``, ``sgc`` (their hops' precompute counted), ``appnp``,
  ``mlp+cs`` and ``sage+cs`` (Correct & Smooth at every evaluation);

and reports, from the JSON logs: time to reach the target test accuracy (98% of the best
final test accuracy of the full-length runs on that dataset, or of mini-batch's with
``--target mini-batch``), training time only (+ precompute) and with the evaluations it ran,
its split (precompute, epochs to the target x median epoch, evaluations), final test accuracy
and peak memory per rank. One chart per dataset plots test accuracy against cumulative
training time (precompute included) for every run.

    python -m bench.fullbatch_vs_minibatch [--datasets arxiv-synth,coauthor-physics,...]
    python -m bench.fullbatch_vs_minibatch --datasets products-synth --ranks 4 --hidden 256 \
        --methods full-batch,full-batch unpruned,mini-batch
    python -m bench.fullbatch_vs_minibatch --datasets arxiv-synth --methods all
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

from bench import propagation_methods as prop
from bench.child import run_checked
from bench.common import CSVWriter, command_line
from bench.plot import LinePanel, Series, save_figure

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHARED = REPO.parent / "shared" / "datasets"

#: Correct & Smooth on arxiv (Huang et al.'s ogbn-arxiv settings: autoscale, alphas 0.979 and
#: 0.756); products-synth keeps the defaults, PyG's products example (fixed scale 20, 1.0, 0.8).
ARXIV_CS = [
    "--correction-scale",
    "auto",
    "--correction-alpha",
    "0.979",
    "--smoothing-alpha",
    "0.756",
]

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
        # short budgets (validated at P = 1, 2: docs/scale.md)
        "recipes": {
            "sign": {"lr": 0.01, "epochs": 80, "eval_every": 4},
            "sgc": {"lr": 0.1, "epochs": 40, "eval_every": 2},
            "appnp": {"lr": 0.01, "epochs": 80, "eval_every": 4},
            "mlp+cs": {"lr": 0.01, "epochs": 40, "eval_every": 10, "flags": ARXIV_CS},
            "sage+cs": {"lr": 0.01, "epochs": 40, "eval_every": 10, "flags": ARXIV_CS},
        },
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
        # not swept at this size (a point costs tens of minutes); C&S's 50 + 50 steps of 47
        # columns over 124M edges cost minutes an evaluation, so its methods evaluate rarely,
        # and mlp+cs is Linear + C&S (OGB's 83.01): an MLP step costs half a SAGE step here
        "recipes": {
            # SIGN at 128 wide: at 256 its evaluation (the inception layer's outputs over every
            # row) needs 24.9 GiB on 4 ranks (`fullgraph plan`); its steps run on the 8%
            # training rows alone (~1 s), so it evaluates every 3 to see the crossing
            "sign": {"lr": 0.01, "epochs": 45, "eval_every": 3, "hidden": 128},
            "sgc": {"lr": 0.1, "epochs": 60, "eval_every": 5},
            "appnp": {"lr": 0.01, "epochs": 30, "eval_every": 5},
            "mlp+cs": {"lr": 0.01, "epochs": 100, "eval_every": 50, "layers": 1},
            "sage+cs": {"lr": 0.01, "epochs": 30, "eval_every": 10, "flags": ["--dropout", "0.2"]},
        },
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
#: Every method ``--methods`` knows (``all``: every one but :data:`SHORT`'s).
BASELINES = ("full-batch", "full-batch int8", "full-batch unpruned", "mini-batch")
METHODS = (*BASELINES, *prop.METHODS)

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


def summarise(
    epochs: list[dict], final: dict, target: float, precompute_s: float = 0.0, method: str = ""
) -> dict[str, float]:
    """Time to target (precompute + training, and with evaluation) and its split, median
    epoch time, final accuracy and peak memory of one run."""
    smoothing = method in prop.METHODS and prop.METHODS[method].smoothing
    return {
        **prop.split(epochs, target, precompute_s, smoothing),
        "median_epoch_s": final["median_epoch_s"],
        "final_test_acc": final["test_acc"],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in epochs),
        "train_time_s": sum(rec["epoch_s"] for rec in epochs),
    }


def curve(epochs: list[dict], start: float = 0.0) -> tuple[list[float], list[float]]:
    """(cumulative training seconds from ``start``, the precompute, and test accuracy) at
    every evaluated epoch."""
    xs, ys, t = [], [], start
    for rec in epochs:
        t += rec["epoch_s"]
        if "test_acc" in rec:
            xs.append(t)
            ys.append(rec["test_acc"])
    return xs, ys


def plot(dataset: str, runs: dict, target: float, out: Path) -> None:
    """Test accuracy against training time, every (method, P) on one chart; ``runs``: (method,
    P) -> (epoch records, precompute seconds)."""
    series = []
    for (method, ranks), (epochs, pre) in sorted(runs.items()):
        style = {"full-batch": "-", "full-batch int8": "-.", "mini-batch": "--"}.get(method, ":")
        xy = curve(epochs, 0.0 if pre != pre else pre)
        series.append(Series(f"{method}, P={ranks}", *xy, style=style, marker="."))
    panel = LinePanel(
        f"{dataset}: time to accuracy, full-batch, mini-batch and exact propagation",
        series,
        xlabel="training time (s, precompute included, evaluation excluded)",
        ylabel="test accuracy",
        hlines=[(target, f"target {target:.3f}")],
    )
    save_figure([panel], out, dpi=120)


def commands(
    args: argparse.Namespace, name: str, p: int, root: Path, parts: Path
) -> list[tuple[str, str, list[str]]]:
    """(method, log tag, command without ``--log-json``) of every method on dataset ``name``
    at P = ``p`` (``root``: its dataset root; ``parts``: its partition directory)."""
    s = SETTINGS[name]
    fb_epochs = max(1, round(s["fb_epochs"] * args.epoch_scale))
    mb_epochs = max(1, round(s["mb_epochs"] * args.epoch_scale))
    layers = len(args.fanouts.split(","))
    model = ["--hidden", str(args.hidden), "--dropout", "0.5", "--input-dropout", "0"]
    model += ["--weight-decay", "0", "--seed", "0", "--threads", str(args.threads), "--quiet"]
    model += ["--precision", args.precision]
    base = [*launcher(p), str(BIN / "fullgraph"), "train", "--parts", str(parts)]
    base += ["--model", "sage", "--layers", str(layers), "--lr", str(s["fb_lr"]), *model]
    every = args.fb_eval_every or s.get("fb_eval_every", 1)
    base += ["--eval-every", str(every), *shlex.split(args.fb_flags)]
    full = [*base, "--epochs", str(fb_epochs)]
    unpruned = [*base, "--epochs", str(args.short_epochs), "--prune", "off"]
    mini = [*launcher(p), str(BIN / "fullgraph"), "minibatch", "--dataset", name]
    mini += ["--root", str(root), "--fanouts", args.fanouts]
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
    prefix = base[: base.index("--model")]
    for method, m in prop.METHODS.items():
        cmd = prop.method_command(method, prefix, s, model, args.epoch_scale)
        variants.append((method, m.tag, cmd))
    return variants


def chosen_methods(text: str) -> set[str]:
    """The methods of ``--methods`` (comma-separated; ``all``: every one but :data:`SHORT`'s);
    an unknown one stops the bench naming those it knows."""
    methods = {m.strip() for m in text.split(",") if m.strip()}
    if "all" in methods:
        methods = (methods - {"all"}) | (set(METHODS) - SHORT)
    if methods - set(METHODS):
        raise SystemExit(
            f"unknown method(s) {sorted(methods - set(METHODS))}; known: all, {', '.join(METHODS)}"
        )
    return methods


def parser() -> argparse.ArgumentParser:
    """The bench's command line."""
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
        help="which methods to run, or all (full-batch int8 = int8 halo compression both ways, "
        "P > 1; full-batch unpruned = --prune off for --short-epochs epochs: what "
        "receptive-field pruning saves per epoch, not part of the target; "
        f"{', '.join(prop.METHODS)}: exact propagation, bench/propagation_methods.py)",
    )
    ap.add_argument(
        "--target",
        choices=("best", "mini-batch"),
        default="best",
        help="98%% of the best final test accuracy of every run (best) or of mini-batch's",
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
    return ap


def main() -> int:
    """Run every (dataset, P, method), then write CSV rows, charts and a summary table."""
    args = parser().parse_args()
    out = Path(args.out)
    work = out / "fullbatch_vs_minibatch"
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.datasets.split(",") if n]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown dataset(s) {unknown}; known: {', '.join(SETTINGS)}")
    ranks_list = [int(r) for r in args.ranks.split(",")]
    methods = chosen_methods(args.methods)
    roots = prepare_root(work / "data", names, Path(args.synth_root))
    layers = len(args.fanouts.split(","))
    csv = CSVWriter(out / "fullbatch_vs_minibatch.csv")
    env_note = f"{os.cpu_count()} cores, {args.threads} thread(s) per rank"
    table = []
    for name in names:
        runs: dict = {}
        for p in ranks_list:
            parts = (Path(args.parts_root) if args.parts_root else work / "parts") / f"{name}-{p}"
            variants = commands(args, name, p, roots[name], parts)
            for method, tag, cmd in variants:
                if method not in methods:
                    continue
                log = work / f"{name}-P{p}-{tag}.jsonl"
                if args.reuse and log.is_file() and '"final": true' in log.read_text():
                    print(f"[{name} P={p}] {method}: reusing {log}", flush=True)
                    runs[(method, p)] = (*read_log(log), float("nan"), prop.load_precompute(log))
                    continue
                if method != "mini-batch" and not (parts / "meta.json").is_file():
                    part_cmd = [str(BIN / "fullgraph"), "partition", "--dataset", name]
                    part_cmd += ["--root", str(roots[name]), "--parts", str(p)]
                    run([*part_cmd, "--out", str(parts), "--force"], args.timeout)
                cmd = [*cmd, "--log-json", str(log)]
                print(f"[{name} P={p}] {method}: {' '.join(cmd)}", flush=True)
                started = time.time()
                wall = run(cmd, args.timeout)
                pre = 0.0
                if method in prop.METHODS and prop.METHODS[method].precompute:
                    pre = prop.precompute_seconds(parts, started)
                    prop.save_precompute(log, pre)
                runs[(method, p)] = (*read_log(log), wall, pre)
        finals = [(m, f["test_acc"]) for (m, _), (_, f, _, _) in runs.items() if m not in SHORT]
        if args.target == "mini-batch":
            finals = [(m, acc) for m, acc in finals if m == "mini-batch"]
            if not finals:
                raise SystemExit("--target mini-batch needs mini-batch in --methods")
        target = 0.98 * max(acc for _, acc in finals)
        for (method, p), (epochs, final, wall, pre) in sorted(runs.items()):
            stats = summarise(epochs, final, target, pre, method)
            units = {
                "time_to_target_s": "s",
                "wall_to_target_s": "s",
                "precompute_s": "s",
                "epochs_to_target": "epochs",
                "eval_to_target_s": "s",
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
        plots = {k: (v[0], v[3]) for k, v in runs.items()}
        plot(name, plots, target, out / f"fbmb_{name}.png")
    whose = "mini-batch's" if args.target == "mini-batch" else "the best"
    print(
        f"\nGraphSAGE mean, {layers} layers, hidden {args.hidden}, fanouts {args.fanouts} (the "
        f"propagation methods: bench/propagation_methods.py); {env_note}; target = 98% of "
        f"{whose} final test accuracy per dataset"
    )
    print(prop.table_text(table))
    print(f"\nCSV: {csv.path}; charts: {out}/fbmb_<dataset>.png; logs: {work}")
    print(f"reproduce with: {command_line()}")
    if not args.parts_root:
        shutil.rmtree(work / "parts", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
