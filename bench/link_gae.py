"""Link prediction under the GAE protocol (issue 35, item 5): test AUC / AP at P = 1 and 4.

Kipf & Welling's graph auto-encoder protocol ("Variational Graph Auto-Encoders", 2016): 85 /
5 / 10 % of the undirected edges for training / validation / test, as many sampled non-edges
as held-out edges for validation and test, node features on, a GCN 32-16 encoder (ReLU, then
linear), the dot-product decoder, Adam at lr 0.01, 200 epochs. Each (dataset, seed, P) goes
through the real commands:

    fullgraph data linksplit --dataset NAME --root ROOT --out SPLIT --name NAME-gae-sS \\
        --val 0.05 --test 0.1 --neg-ratio 1 --seed S
    fullgraph partition --dataset NAME-gae-sS --root SPLIT --parts P --out PARTS
    mpirun -n P fullgraph train --parts PARTS --task link --decoder dot ... --seed S

(P = 1 runs without ``mpirun``). The seed draws the split and the training (initialisation
and the training negatives, one fresh 1:1 draw per epoch); the test score is the one at the
best validation AUC (Kipf & Welling report the model after 200 epochs; the validation
selection is ours). Where our protocol differs from theirs: their loss is the weighted cross
entropy over every pair of nodes (the dense adjacency), ours over the training edges and as
many hashed negatives (PyG's ``GAE.recon_loss``); they average 10 runs, we 3 seeds.

The table gives mean +- sample std of the test AUC and AP (%) over the seeds at each P,
beside the GAE row of Kipf & Welling's Table 1 (Cora 91.0 / 92.0, CiteSeer 89.5 / 89.9;
Coauthor CS and Amazon Photo have no published GAE row), and the largest |P=4 - P=1|
difference of the same seed's test AUC and AP per dataset (training is exact at any P, so it
should be 0 or within 1e-5).

    python -m bench.link_gae --out bench/results
    python -m bench.link_gae --datasets cora --seeds 0 --ranks 1 4
    python -m bench.link_gae --table bench/results/link_gae.csv

The raw data are read from ``--shared`` (default ``/work/shared/datasets``) through links in
a temporary root; nothing is written there. Writes ``OUT/link_gae.csv`` (long format,
bench/common.py) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.child import REPO, run_checked
from bench.common import CSVWriter

SHARED = REPO.parent / "shared" / "datasets"
BIN = Path(sys.executable).parent

#: name -> (label of the table, directory of the shared raw data)
DATASETS: dict[str, tuple[str, str]] = {
    "cora": ("Cora", "cora"),
    "citeseer": ("CiteSeer", "citeseer"),
    "coauthor-cs": ("Coauthor CS", "coauthor_cs"),
    "amazon-photo": ("Amazon Photo", "amazon_photo"),
}
#: GAE's row of Kipf & Welling 2016, Table 1: (test AUC, test AP) in %.
PUBLISHED: dict[str, tuple[float, float]] = {"cora": (91.0, 92.0), "citeseer": (89.5, 89.9)}
PUBLISHED_SOURCE = "Kipf & Welling 2016 (GAE)"
#: The split: validation and test shares of the undirected edges, negatives per positive.
SPLIT = ("--val", "0.05", "--test", "0.1", "--neg-ratio", "1")
#: The GAE recipe as ``fullgraph train`` flags.
RECIPE = (
    "--task",
    "link",
    "--model",
    "gcn",
    "--layers",
    "2",
    "--hidden",
    "32",
    "--embed-dim",
    "16",
    "--decoder",
    "dot",
    "--lr",
    "0.01",
    "--weight-decay",
    "0",
    "--dropout",
    "0",
    "--epochs",
    "200",
    "--link-batch",
    "0",
    "--neg-ratio",
    "1",
)
#: The scores the table shows: (final record key, CSV metric).
SCORES = (("test_auc", "test_auc"), ("test_ap", "test_ap"))

#: (dataset, ranks) -> the per-seed scores: seed -> {"test_auc": %, "test_ap": %}
Results = dict[tuple[str, int], dict[int, dict[str, float]]]


def split_name(name: str, seed: int) -> str:
    """The dataset ``fullgraph data linksplit`` writes for ``name`` and ``seed``."""
    return f"{name}-gae-s{seed}"


def make_root(work: Path, names: list[str], shared: Path) -> Path:
    """A dataset root under ``work`` whose ``<dir>/raw`` link to the shared raw folders
    (nothing is written next to the shared data)."""
    root = work / "root"
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        d = DATASETS[name][1]
        src = shared / d / "raw"
        if not src.is_dir():
            raise SystemExit(f"--shared: {src} is missing (dataset {name})")
        (root / d).mkdir(exist_ok=True)
        link = root / d / "raw"
        if not link.exists():
            link.symlink_to(src, target_is_directory=True)
    return root


def linksplit_command(name: str, root: Path, seed: int, out: Path) -> list[str]:
    """``fullgraph data linksplit`` of ``name`` (read from ``root``): its GAE split for
    ``seed``, written as dataset :func:`split_name` under the root ``out``."""
    cmd = [str(BIN / "fullgraph"), "data", "linksplit", "--dataset", name, "--root", str(root)]
    cmd += ["--out", str(out), "--name", split_name(name, seed), *SPLIT, "--seed", str(seed)]
    return [*cmd, "--force"]


def partition_command(dataset: str, root: Path, ranks: int, out: Path) -> list[str]:
    """``fullgraph partition`` of the split ``dataset`` into ``ranks`` parts at ``out``."""
    cmd = [str(BIN / "fullgraph"), "partition", "--dataset", dataset, "--root", str(root)]
    return [*cmd, "--parts", str(ranks), "--out", str(out), "--force"]


def train_command(parts: Path, ranks: int, seed: int, log: Path, threads: int) -> list[str]:
    """``[mpirun -n P] fullgraph train --parts PARTS --task link`` with the GAE recipe."""
    launch = [str(BIN / "mpirun"), "-n", str(ranks)] if ranks > 1 else []
    cmd = [*launch, str(BIN / "fullgraph"), "train", "--parts", str(parts), *RECIPE]
    cmd += ["--seed", str(seed), "--threads", str(threads), "--quiet", "--force"]
    return [*cmd, "--log-json", str(log)]


def read_scores(log: Path) -> dict[str, float]:
    """The test AUC and AP (%) at the best validation epoch: the final record's, or where it
    has no ``test_ap``, the AP of its ``best_epoch``'s record."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    final = records[-1] if records else {}
    if final.get("task") != "link" or final.get("metric") != "auc":
        raise SystemExit(f"{log}: the last record is no final record of an auc link run")
    best = [r for r in records[:-1] if r.get("epoch") == final.get("best_epoch")]
    out = {}
    for key, _ in SCORES:
        source = final if key in final else (best[-1] if best else {})
        if key not in source:
            raise SystemExit(f"{log}: no {key} in the final record or its best epoch's")
        out[key] = 100 * float(source[key])
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _cell(per_seed: dict[int, dict[str, float]] | None, key: str) -> str:
    if not per_seed:
        return "—"
    m, s = mean_std([scores[key] for _, scores in sorted(per_seed.items())])
    return f"{m:.1f} ± {s:.1f}"


def max_rank_difference(results: Results, name: str, ranks: list[int]) -> dict[str, float]:
    """Per score, the largest |P - P_min| (percentage points) over the seeds run at both the
    fewest ranks and another P; NaN when no seed was run at two rank counts."""
    base = results.get((name, min(ranks)), {})
    out = {}
    for key, _ in SCORES:
        diffs = [
            abs(results[(name, p)][seed][key] - base[seed][key])
            for p in ranks
            if p != min(ranks) and (name, p) in results
            for seed in results[(name, p)]
            if seed in base
        ]
        out[key] = max(diffs) if diffs else float("nan")
    return out


def _diff(value: float) -> str:
    return "—" if value != value else f"{value:.2g}"


def table(results: Results, names: list[str], ranks: list[int]) -> str:
    """The markdown table: a row per dataset, test AUC and AP (%) mean ± std at each P, the
    published GAE figures, and the largest |P - P_min| of the same seed's scores."""
    ranks = sorted(ranks)
    head = ["dataset"]
    for p in ranks:
        head += [f"AUC P={p}", f"AP P={p}"]
    head += [f"{PUBLISHED_SOURCE} AUC / AP"]
    if len(ranks) > 1:
        head += [f"max abs P={'/'.join(map(str, ranks[1:]))} - P={ranks[0]} (AUC / AP, pt)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        cells = [DATASETS[name][0]]
        for p in ranks:
            cells += [_cell(results.get((name, p)), key) for key, _ in SCORES]
        published = PUBLISHED.get(name)
        cells.append(
            "no published row" if published is None else f"{published[0]:.1f} / {published[1]:.1f}"
        )
        if len(ranks) > 1:
            d = max_rank_difference(results, name, ranks)
            cells.append(" / ".join(_diff(d[key]) for key, _ in SCORES))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_csv_results(path: Path) -> Results:
    """The per-seed scores in a CSV this bench wrote (the last row of each dataset, P, seed
    and score: a rerun replaces an earlier one)."""
    out: Results = {}
    metrics = {metric: key for key, metric in SCORES}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name, seed = row["what"], row["x"].removeprefix("seed")
            if name in DATASETS and row["metric"] in metrics and seed.isdigit():
                per_seed = out.setdefault((name, int(row["ranks"])), {})
                per_seed.setdefault(int(seed), {})[metrics[row["metric"]]] = float(row["y"])
    return out


def _split_list(text: str) -> list[str]:
    items = [x for x in text.split(",") if x]
    unknown = [x for x in items if x not in DATASETS]
    if unknown or not items:
        known = ", ".join(DATASETS)
        raise SystemExit(f"--datasets: unknown {', '.join(unknown) or '(none)'} (known: {known})")
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's options (checked: unknown datasets, no seeds, ranks below 1)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4], help="process counts P")
    ap.add_argument("--shared", default=str(SHARED), help="the shared datasets (read-only)")
    ap.add_argument("--threads", type=int, default=2, help="threads of the whole run")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a command may take")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--table", metavar="CSV", help="print the table of an earlier run's CSV")
    a = ap.parse_args(argv)
    a.datasets = _split_list(a.datasets)
    if any(p < 1 for p in a.ranks):
        raise SystemExit(f"--ranks: at least 1 each, not {a.ranks}")
    a.ranks = sorted(set(a.ranks))
    a.seeds = list(dict.fromkeys(a.seeds))
    return a


def main(argv: list[str] | None = None) -> int:
    """Split, partition and train every (dataset, seed, P); print and write the table."""
    a = parse_args(argv)
    if a.table:
        results = read_csv_results(Path(a.table))
        names = [n for n in a.datasets if any(k[0] == n for k in results)]
        ranks = sorted({p for _, p in results})
        print(table(results, names, ranks))
        return 0
    work = Path(tempfile.mkdtemp(prefix="fg-linkgae-"))
    rows = CSVWriter(Path(a.out) / "link_gae.csv")
    results: Results = {}
    t_all = time.perf_counter()
    try:
        root = make_root(work, a.datasets, Path(a.shared))
        for name in a.datasets:
            for seed in a.seeds:
                split_root = work / f"split-{name}-s{seed}"  # one root per split: removed after
                run_checked(linksplit_command(name, root, seed, split_root), timeout=a.timeout)
                for p in a.ranks:
                    parts = work / f"{name}-s{seed}-P{p}"
                    part = partition_command(split_name(name, seed), split_root, p, parts)
                    run_checked(part, timeout=a.timeout)
                    log = work / f"{name}-s{seed}-P{p}.jsonl"
                    threads = max(1, a.threads // p)
                    t0 = time.perf_counter()
                    run_checked(train_command(parts, p, seed, log, threads), timeout=a.timeout)
                    seconds = time.perf_counter() - t0
                    got = read_scores(log)
                    results.setdefault((name, p), {})[seed] = got
                    rows.write(name, "fullgraph", "wall_time", "s", f"seed{seed}", seconds, p)
                    for key, metric in SCORES:
                        rows.write(name, "fullgraph", metric, "%", f"seed{seed}", got[key], p)
                    shown = ", ".join(f"{k} {v:.2f}" for k, v in got.items())
                    print(f"{name} seed {seed} P={p}: {shown} ({seconds:.0f} s)", flush=True)
                    shutil.rmtree(parts, ignore_errors=True)
                shutil.rmtree(split_root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for (name, p), per_seed in sorted(results.items()):
        for key, metric in SCORES:
            m, s = mean_std([v[key] for v in per_seed.values()])
            rows.write(name, "fullgraph", f"{metric}_mean", "%", "mean", m, p)
            rows.write(name, "fullgraph", f"{metric}_std", "%", "std", s, p)
    for name in a.datasets:
        if name in PUBLISHED:
            for (_, metric), value in zip(SCORES, PUBLISHED[name], strict=True):
                rows.write(name, PUBLISHED_SOURCE, f"{metric}_mean", "%", "mean", value)
    total = time.perf_counter() - t_all
    rows.write("link_gae", "fullgraph", "wall_time", "s", "total", total)
    seeds = ", ".join(map(str, a.seeds))
    print(f"\ntest AUC / AP (%) at the best validation AUC, mean ± std over seeds {seeds}")
    print(table(results, a.datasets, a.ranks))
    print(f"\n{total:.0f} s in all; rows in {rows.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
