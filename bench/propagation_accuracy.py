"""Accuracy of the propagation methods on real data (issue 34, item 4): one table, seeds 0-2.

For Amazon Computers, Coauthor Physics, CiteSeer and Tolokers (ROC-AUC), one process
(``fullgraph train --dataset NAME``), seeds 0-2, the test score at the best validation epoch
of: the base model (GCN), an MLP, base + Correct & Smooth, MLP + C&S, SIGN (K = 3), SGC (K = 2)
and APPNP (K = 10, alpha 0.1); mean +- std over the seeds (sample std), beside the published
figures where the protocol matches (:data:`PUBLISHED`; the notes say where it does not).

The runs: ``gcn`` and ``mlp`` train with ``--correct-smooth`` (C&S evaluates every epoch, no
effect on the training itself): the final record's test is the smoothed one at the best
smoothed validation epoch (``+ C&S``), and the epoch lines' ``base_val_*`` / ``base_test_*``
give the model alone at its own best validation epoch (the first of a tie, as the trainer
picks). ``sign``, ``sgc`` and ``appnp`` are one plain run each.

Recipes (:data:`DATASETS`), small enough for the whole bench to run in < 25 min on a 2-core
CPU (fewer epochs where the validation curve is flat, evaluated every few epochs: C&S's 100
propagation steps per evaluation cost twice a training step): Computers: bench/precision.py's
GCN 2 x 64, lr 0.005, weight decay 5e-4, dropout 0.5, 80 epochs, evaluated every 4; Physics:
the same at lr 0.01 for 15 epochs, every 3 (its 8,415 dense features make a step ~1.4 s);
CiteSeer: PyG's ``examples/gcn.py`` (GCN 2 x 16, ``--normalize-features``, lr 0.01, weight
decay 5e-4, 200 epochs, every epoch); Tolokers: GCN 2 x 64 with LayerNorm and residuals
(Platonov et al.'s GNN form, smaller), dropout 0.2, lr 0.01, no weight decay, 80 epochs, every
4. MLP, SIGN and APPNP take the dataset's recipe at hidden 64 (Tolokers: with LayerNorm and
residuals, as Platonov et al.'s ResNet); SIGN without input dropout; SGC is one linear layer on
``A^2 X`` (Wu et al.: lr 0.2, no dropout). C&S: ``--cs`` (default autoscale, correction alpha
0.5, smoothing alpha 0.8, 50 + 50 steps; the same for every dataset, untuned).

Splits: CiteSeer Planetoid's public split; Computers / Physics a random 20 / 30 per class
split seeded by ``--seed`` (Shchur et al.'s sizes; they keep the largest connected component,
we the whole graph); Tolokers the dataset's fixed split K = the seed (Platonov et al. average
their 10).

    python -m bench.propagation_accuracy --out bench/results
    python -m bench.propagation_accuracy --datasets citeseer --methods gcn,sgc --seeds 0

Writes ``OUT/propagation_accuracy.csv`` (long format, bench/common.py; its ``command`` column
reproduces the table) and prints the markdown table; ``--table CSV`` prints the table of such
a file (several runs' rows together: the last of each dataset, method and seed).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.child import REPO, run_checked
from bench.common import CSVWriter

SHARED = REPO.parent / "shared" / "datasets"


@dataclass(frozen=True)
class Dataset:
    """One dataset's row of the table: where it comes from and its recipe."""

    label: str
    #: ``fullgraph train`` data flags; ``{root}`` and ``{seed}`` are filled in
    source: tuple[str, ...]
    #: flags every method shares (lr, weight decay, epochs, ...)
    common: tuple[str, ...]
    #: the base GCN's own flags
    base: tuple[str, ...]
    #: the shared directory linked as ``<root>/<name>/raw`` (None: generated)
    shared: str | None = None
    #: flags of the per-row models (MLP, SIGN, APPNP) beside ``common``
    extra: tuple[str, ...] = field(default=())


def _real(name: str) -> tuple[str, ...]:
    return ("--dataset", name, "--root", "{root}")


GCN_64 = ("--lr", "0.005", "--weight-decay", "5e-4", "--dropout", "0.5")
DATASETS: dict[str, Dataset] = {
    "amazon-computers": Dataset(
        "Computers",
        _real("amazon-computers"),
        (*GCN_64, "--epochs", "80", "--eval-every", "4"),
        ("--hidden", "64"),
        "amazon_computers",
    ),
    "coauthor-physics": Dataset(
        "Physics",
        _real("coauthor-physics"),
        (*GCN_64, "--lr", "0.01", "--epochs", "15", "--eval-every", "3"),
        ("--hidden", "64"),
        "coauthor_physics",
    ),
    "citeseer": Dataset(
        "CiteSeer",
        _real("citeseer"),
        ("--lr", "0.01", "--weight-decay", "5e-4", "--normalize-features", "--epochs", "200"),
        ("--hidden", "16"),
        "citeseer",
    ),
    "tolokers": Dataset(
        "Tolokers (ROC-AUC)",
        (*_real("tolokers"), "--split", "{seed}"),
        (
            "--lr",
            "0.01",
            "--weight-decay",
            "0",
            "--dropout",
            "0.2",
            "--epochs",
            "80",
            "--eval-every",
            "4",
        ),
        ("--hidden", "64", "--norm", "layer", "--residual"),
        "tolokers",
        ("--norm", "layer", "--residual"),
    ),
    # a generated graph for the bench's own test (not in the default set)
    "tiny": Dataset(
        "tiny (generated)", ("--synthetic", "tiny"), ("--epochs", "2"), ("--hidden", "8")
    ),
}
DEFAULT_DATASETS = ("amazon-computers", "coauthor-physics", "citeseer", "tolokers")
#: the order the runs go in: the cheap datasets first (their rows are in the CSV early)
RUN_ORDER = ("tiny", "citeseer", "tolokers", "amazon-computers", "coauthor-physics")

#: method -> (row label, ``fullgraph train`` flags beside the dataset's); ``+cs`` rows come
#: from the ``gcn`` / ``mlp`` runs.
METHODS: dict[str, str] = {
    "gcn": "base (GCN)",
    "mlp": "MLP",
    "gcn+cs": "base + C&S",
    "mlp+cs": "MLP + C&S",
    "sign": "SIGN (K=3)",
    "sgc": "SGC (K=2)",
    "appnp": "APPNP (K=10, alpha 0.1)",
}
#: the runs: run -> the methods it gives
RUNS: dict[str, tuple[str, ...]] = {
    "gcn": ("gcn", "gcn+cs"),
    "mlp": ("mlp", "mlp+cs"),
    "sign": ("sign",),
    "sgc": ("sgc",),
    "appnp": ("appnp",),
}
CS_DEFAULT = "--correction-scale auto --correction-alpha 0.5 --smoothing-alpha 0.8"

#: Published (mean, std, source) in %, where the protocol matches ours closely enough to set
#: beside it; the notes of the doc say what differs.
PUBLISHED: dict[tuple[str, str], tuple[float, float | None, str]] = {
    ("amazon-computers", "gcn"): (82.6, 2.4, "Shchur et al. 2018"),
    ("amazon-computers", "mlp"): (44.9, 5.8, "Shchur et al. 2018"),
    ("coauthor-physics", "gcn"): (92.8, 1.0, "Shchur et al. 2018"),
    ("coauthor-physics", "mlp"): (88.9, 1.1, "Shchur et al. 2018"),
    ("citeseer", "gcn"): (70.3, None, "Kipf & Welling 2017"),
    ("citeseer", "sgc"): (71.9, 0.1, "Wu et al. 2019"),
    ("tolokers", "gcn"): (83.64, 0.67, "Platonov et al. 2023"),
    ("tolokers", "mlp"): (72.95, 1.06, "Platonov et al. 2023 (ResNet)"),
}


def method_flags(ds: Dataset, run: str) -> list[str]:
    """``fullgraph train`` flags of one run on ``ds`` (the dataset's common recipe first)."""
    flags = list(ds.common)
    if run == "gcn":
        return [*flags, "--model", "gcn", *ds.base]
    if run == "sgc":  # Wu et al.: one linear layer on A^K X, lr 0.2, no dropout
        lr = ["--lr", "0.2", "--dropout", "0", "--input-dropout", "0"]
        return [*flags, "--model", "sgc", "--layers", "1", "--hops", "2", *lr]
    model = {
        "mlp": ["--model", "mlp"],
        "sign": ["--model", "sign", "--hops", "3", "--input-dropout", "0"],
        "appnp": ["--model", "appnp", "--hops", "10", "--alpha", "0.1"],
    }[run]
    return [*flags, *model, "--hidden", "64", *ds.extra]


def make_root(work: Path, names: list[str], shared: Path) -> Path:
    """A dataset root under ``work`` whose ``<dir>/raw`` link to the shared raw folders
    (read-only: nothing is written next to the shared data)."""
    root = work / "root"
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        d = DATASETS[name].shared
        if d is None:
            continue
        src = shared / d / "raw"
        if not src.is_dir():
            raise SystemExit(f"--shared: {src} is missing (dataset {name})")
        (root / d).mkdir(exist_ok=True)
        link = root / d / "raw"
        if not link.exists():
            link.symlink_to(src, target_is_directory=True)
    return root


def read_log(log: Path) -> tuple[list[dict], dict]:
    """A run's epoch records and its final record."""
    recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in recs if "epoch" in r and not r.get("final")], recs[-1]


def scores(run: str, log: Path) -> dict[str, float]:
    """method -> test score (%) at its best validation epoch, from a run's log."""
    epochs, final = read_log(log)
    m = final["metric"]
    out = {RUNS[run][0]: 100 * float(final[f"test_{m}"])}
    if len(RUNS[run]) == 2:  # --correct-smooth: final = smoothed; the model alone per epoch
        evaluated = [r for r in epochs if f"base_val_{m}" in r]
        best = max(evaluated, key=lambda r: r[f"base_val_{m}"])  # first of a tie
        out = {RUNS[run][0]: 100 * float(best[f"base_test_{m}"]), RUNS[run][1]: out[run]}
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _cell(values: list[float] | None) -> str:
    if not values:
        return "—"
    m, s = mean_std(values)
    return f"{m:.1f} ± {s:.1f}"


def _paper(name: str, method: str) -> str:
    p = PUBLISHED.get((name, method))
    if p is None:
        return "—"
    return f"{p[0]:.1f}" + ("" if p[1] is None else f" ± {p[1]:.1f}")


def table(results: dict[tuple[str, str], list[float]], names: list[str], methods: list[str]) -> str:
    """The markdown table: a row per method, ours and the published figure per dataset."""
    head = ["method"]
    for n in names:
        head += [DATASETS[n].label, "published"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in methods:
        cells = [METHODS[method]]
        for n in names:
            cells += [_cell(results.get((n, method))), _paper(n, method)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_csv_results(path: Path) -> dict[tuple[str, str], list[float]]:
    """(dataset, method) -> the per-seed test scores in a CSV this bench wrote (the last row of
    each dataset, method and seed: a rerun replaces an earlier one)."""
    last: dict[tuple[str, str, str], float] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name, _, method = row["what"].partition(" ")
            if row["metric"] == "test" and name in DATASETS and method in METHODS:
                last[(name, method, row["x"])] = float(row["y"])
    out: dict[tuple[str, str], list[float]] = {}
    for (name, method, _seed), y in sorted(last.items()):
        out.setdefault((name, method), []).append(y)
    return out


def _split_list(text: str, known: dict, what: str) -> list[str]:
    items = [x for x in text.split(",") if x]
    unknown = [x for x in items if x not in known]
    if unknown or not items:
        raise SystemExit(
            f"--{what}: unknown {', '.join(unknown) or '(none)'} (known: {', '.join(known)})"
        )
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's options (checked: unknown datasets or methods, no seeds)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default=",".join(DEFAULT_DATASETS), help="comma-separated")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, help="epochs of every run (default: each dataset's)")
    ap.add_argument("--cs", default=CS_DEFAULT, help="C&S flags of fullgraph train")
    ap.add_argument("--shared", default=str(SHARED), help="the shared datasets (read-only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--table", metavar="CSV", help="print the table of an earlier run's CSV")
    a = ap.parse_args(argv)
    a.datasets = _split_list(a.datasets, DATASETS, "datasets")
    a.methods = _split_list(a.methods, METHODS, "methods")
    if a.epochs is not None and a.epochs < 1:
        raise SystemExit(f"--epochs: at least 1, not {a.epochs}")
    return a


def plan_runs(a: argparse.Namespace) -> list[str]:
    """The runs the chosen methods need (``gcn+cs`` needs the ``gcn`` run, ...)."""
    return [run for run, gives in RUNS.items() if set(gives) & set(a.methods)]


def run_one(a: argparse.Namespace, name: str, run: str, seed: int, root: Path, work: Path) -> Path:
    """One ``fullgraph train``; its JSONL log."""
    ds = DATASETS[name]
    source = [s.format(root=root, seed=seed) for s in ds.source]
    flags = method_flags(ds, run)
    if a.epochs is not None:
        flags += ["--epochs", str(a.epochs)]  # the last --epochs wins
    if run in ("gcn", "mlp") and {f"{run}+cs"} & set(a.methods):
        flags += ["--correct-smooth", *shlex.split(a.cs)]
    log = work / f"{name}-{run}-{seed}.jsonl"
    cmd = [sys.executable, "-m", "fullgraph.cli", "train", *source, *flags, "--seed", str(seed)]
    cmd += ["--threads", str(a.threads), "--quiet", "--force", "--log-json", str(log)]
    cmd += ["--save-model", str(work / "model.pt")]
    run_checked(cmd, timeout=a.timeout)
    return log


def main(argv: list[str] | None = None) -> int:
    """Train every (dataset, run, seed); print and write the table."""
    a = parse_args(argv)
    if a.table:
        results = read_csv_results(Path(a.table))
        names = [n for n in a.datasets if any(k[0] == n for k in results)]
        print(table(results, names, [m for m in a.methods if any(k[1] == m for k in results)]))
        return 0
    runs = plan_runs(a)
    work = Path(tempfile.mkdtemp(prefix="fg-propacc-"))
    rows = CSVWriter(Path(a.out) / "propagation_accuracy.csv")
    results: dict[tuple[str, str], list[float]] = {}
    t_all = time.perf_counter()
    try:
        root = make_root(work, a.datasets, Path(a.shared))
        for name in sorted(a.datasets, key=RUN_ORDER.index):
            for run in runs:
                for seed in a.seeds:
                    t0 = time.perf_counter()
                    got = scores(run, run_one(a, name, run, seed, root, work))
                    seconds = time.perf_counter() - t0
                    what = f"{name} {run}"
                    rows.write(what, "fullgraph", "wall_time", "s", f"seed{seed}", seconds)
                    for method, y in got.items():
                        if method not in a.methods:
                            continue
                        results.setdefault((name, method), []).append(y)
                        rows.write(f"{name} {method}", "fullgraph", "test", "%", f"seed{seed}", y)
                    shown = ", ".join(f"{m} {y:.2f}" for m, y in got.items())
                    print(f"{name} {run} seed {seed}: {shown} ({seconds:.0f} s)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for (name, method), values in results.items():
        m, s = mean_std(values)
        rows.write(f"{name} {method}", "fullgraph", "test_mean", "%", "mean", m)
        rows.write(f"{name} {method}", "fullgraph", "test_std", "%", "std", s)
        p = PUBLISHED.get((name, method))
        if p is not None:
            rows.write(f"{name} {method}", p[2], "test_mean", "%", "mean", p[0])
    total = time.perf_counter() - t_all
    rows.write("propagation_accuracy", "fullgraph", "wall_time", "s", "total", total)
    seeds = ", ".join(map(str, a.seeds))
    print(f"\ntest score (%) at the best validation epoch, mean ± std over seeds {seeds}")
    print(table(results, a.datasets, a.methods))
    print(f"\n{total:.0f} s in all; rows in {rows.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
