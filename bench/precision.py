"""float32 against bf16-mixed (``--precision``): step time, peak memory and accuracy, one run.

Speed (``--part speed``): the real ``fullgraph train`` on arxiv-synth (generated under
``--root`` when missing), one process and ``mpirun -n 2`` / ``-n 4`` (one thread per rank,
METIS parts), GCN / GraphSAGE 3 x 256 and GAT 3 x 64 x 4 heads, ``--epochs`` epochs; every
configuration runs at both precisions back to back and the whole set ``--rounds`` times, so
the machine's load falls on both alike. Reported: median epoch over the rounds (the epoch's
own median), the bf16 speed-up, peak RSS per rank (max over ranks). ``--products`` adds
products-synth at P=4 (GraphSAGE 3 x 256, 3 epochs; most of a 24 GiB machine).

Accuracy (``--part accuracy``): one process, seeds 0-2, both precisions, test accuracy at the
best validation epoch: Cora and CiteSeer (GCN 2 x 16, PyG's recipe), Amazon Computers and
Coauthor CS (GCN 2 x 64, lr 0.005), arxiv-synth (GCN 3 x 256, 100 epochs). Accuracy does not depend
on the machine's load.

    python -m bench.precision --part speed --rounds 3 --out /tmp/prec
    python -m bench.precision --part accuracy --out /tmp/prec

Writes ``OUT/precision.csv`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench.child import run_checked
from bench.common import CSVWriter, median

BIN = Path(sys.executable).parent
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
PRECISIONS = ("32", "bf16-mixed")

#: Speed models: (name, ``fullgraph train`` flags).
MODELS = {
    "gcn": ["--model", "gcn", "--layers", "3", "--hidden", "256"],
    "sage": ["--model", "sage", "--layers", "3", "--hidden", "256"],
    "gat": ["--model", "gat", "--layers", "3", "--hidden", "64", "--heads", "4"],
}
COMMON = ["--dropout", "0.5", "--input-dropout", "0", "--quiet", "--force"]

#: Accuracy cases: (dataset, root, ``fullgraph train`` flags).
GCN_SMALL = ["--model", "gcn", "--hidden", "16", "--normalize-features", "--epochs", "200"]
#: lr 0.005 as bench.fullbatch_vs_minibatch tunes Amazon Computers: at 0.01 its loss jumps at
#: step 2 and runs of either precision scatter by seed (the figures in docs/train.md).
GCN_64 = ["--model", "gcn", "--hidden", "64", "--epochs", "200", "--lr", "0.005"]
GCN_ARXIV = ["--model", "gcn", "--layers", "3", "--hidden", "256", "--input-dropout", "0"]
ACCURACY = [
    ("cora", "shared", GCN_SMALL),
    ("citeseer", "shared", GCN_SMALL),
    ("amazon-computers", "shared", GCN_64),
    ("coauthor-cs", "shared", GCN_64),
    ("arxiv-synth", "synth", [*GCN_ARXIV, "--epochs", "100", "--weight-decay", "0"]),
]


def _log(log: Path) -> tuple[list[dict], dict]:
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in recs if "epoch_s" in r], next(r for r in recs if r.get("final"))


def _ensure_arxiv(root: str, out: Path) -> dict[int, Path]:
    """arxiv-synth under ``root`` (generated if missing) and its 2- and 4-part METIS parts."""
    if not (Path(root) / "arxiv_synth" / "meta.json").is_file():
        cmd = [str(BIN / "fullgraph"), "data", "synth", "--preset", "arxiv"]
        run_checked([*cmd, "--name", "arxiv-synth", "--root", root], timeout=1800)
    parts = {}
    for p in (2, 4):
        parts[p] = out / "parts" / f"arxiv-synth-{p}"
        if not (parts[p] / "meta.json").is_file():
            cmd = [str(BIN / "fullgraph"), "partition", "--dataset", "arxiv-synth"]
            cmd += ["--root", root, "--parts", str(p), "--out", str(parts[p]), "--force"]
            run_checked(cmd, timeout=1800)
    return parts


def speed(a: argparse.Namespace, csv: CSVWriter) -> None:
    """The interleaved speed and memory table."""
    out = Path(a.out)
    parts = _ensure_arxiv(a.root, out)
    cases: list[tuple[str, int, list[str]]] = []
    models = a.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")
    rank_counts = [int(r) for r in a.ranks.split(",")]
    if not set(rank_counts) <= {1, 2, 4}:
        raise SystemExit(f"--ranks: choose from 1, 2, 4, not {a.ranks}")
    for model in models:
        flags = MODELS[model]
        for ranks in rank_counts:
            data = ["--dataset", "arxiv-synth", "--root", a.root, "--threads", "1"]
            if ranks > 1:
                data = ["--parts", str(parts[ranks])]
            cases.append(
                (f"arxiv-synth {model}", ranks, [*flags, *data, "--epochs", str(a.epochs)])
            )
    if a.products:
        cases.append(_products_case(a, out))
    res: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    log = Path(tempfile.mkdtemp(prefix="fg-prec-")) / "log.json"
    for _ in range(a.rounds):
        for what, ranks, flags in cases:
            for prec in PRECISIONS:
                cmd = [str(BIN / "fullgraph"), "train", *flags, *COMMON, "--precision", prec]
                cmd += ["--log-json", str(log)]
                if ranks > 1:
                    cmd = [str(BIN / "mpirun"), "-n", str(ranks), *cmd]
                run_checked(cmd, timeout=a.timeout)
                epochs, _ = _log(log)
                step = median(r["epoch_s"] for r in epochs[1:] or epochs)
                peak = max(r["peak_rss_mb"] for r in epochs)
                res.setdefault((what, ranks, prec), []).append((step, peak))
    print(f"\nspeed, {a.rounds} round(s), median epoch (s) and peak RSS per rank (MiB)")
    print("| case | P | float32 epoch | bf16-mixed epoch | speed-up | float32 peak | bf16 peak |")
    print("|---|---|---|---|---|---|---|")
    for what, ranks, _flags in cases:
        row = {}
        for prec in PRECISIONS:
            values = res[(what, ranks, prec)]
            row[prec] = (median(v[0] for v in values), max(v[1] for v in values))
            csv.write(what, prec, "epoch", "s", ranks, row[prec][0], ranks)
            csv.write(what, prec, "peak_rss_mb", "MiB", ranks, row[prec][1], ranks)
        (t32, m32), (t16, m16) = row["32"], row["bf16-mixed"]
        cells = [what, ranks, f"{t32:.3f}", f"{t16:.3f}", f"{t32 / t16:.2f}x", f"{m32:.0f}"]
        print("| " + " | ".join(map(str, [*cells, f"{m16:.0f}"])) + " |")


def _products_case(a: argparse.Namespace, out: Path) -> tuple[str, int, list[str]]:
    root = a.products_root
    if not (Path(root) / "products_synth" / "meta.json").is_file():
        cmd = [str(BIN / "fullgraph"), "data", "synth", "--preset", "products"]
        run_checked([*cmd, "--name", "products-synth", "--root", root], timeout=3600)
    parts = Path(a.products_parts or out / "parts" / "products-synth-4")
    if not (parts / "meta.json").is_file():
        cmd = [str(BIN / "fullgraph"), "partition", "--dataset", "products-synth", "--root", root]
        run_checked([*cmd, "--parts", "4", "--out", str(parts), "--force"], timeout=3600)
    flags = [*MODELS["sage"], "--parts", str(parts), "--epochs", "3", "--eval-every", "3"]
    return ("products-synth sage", 4, flags)


def accuracy(a: argparse.Namespace, csv: CSVWriter) -> None:
    """The accuracy table: mean test accuracy over seeds at both precisions."""
    work = Path(tempfile.mkdtemp(prefix="fg-prec-acc-"))
    if any(
        root == "synth" and (not a.datasets or name in a.datasets) for name, root, _ in ACCURACY
    ):
        _ensure_arxiv(a.root, Path(a.out))
    print("\naccuracy: test at best validation, mean over seeds 0-2 (one process)")
    print("| dataset | float32 | bf16-mixed | difference (pt) | per seed (32 / bf16) |")
    print("|---|---|---|---|---|")
    for name, where, flags in ACCURACY:
        if a.datasets and name not in a.datasets.split(","):
            continue
        root = a.root if where == "synth" else a.shared_root
        tests: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for seed in range(3):
            for prec in PRECISIONS:
                log = work / f"{name}-{seed}-{prec}.json"
                cmd = [str(BIN / "fullgraph"), "train", "--dataset", name, "--root", root]
                cmd += [*flags, "--seed", str(seed), "--precision", prec, "--quiet", "--force"]
                run_checked([*cmd, "--log-json", str(log)], timeout=a.timeout)
                tests[prec].append(float(_log(log)[1]["test_acc"]))
        m32, m16 = statistics.mean(tests["32"]), statistics.mean(tests["bf16-mixed"])
        for prec in PRECISIONS:
            csv.write(
                f"accuracy {name}",
                prec,
                "test_acc",
                "acc",
                "mean of 3 seeds",
                statistics.mean(tests[prec]),
            )
        seeds = ", ".join(
            f"{x:.4f}/{y:.4f}" for x, y in zip(tests["32"], tests["bf16-mixed"], strict=True)
        )
        print(f"| {name} | {m32:.4f} | {m16:.4f} | {100 * (m16 - m32):+.2f} | {seeds} |")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("speed", "accuracy", "all"), default="all")
    ap.add_argument("--root", default="/tmp/fg-data/data", help="root of arxiv-synth")
    ap.add_argument("--shared-root", default=str(SHARED), help="root of the real datasets")
    ap.add_argument("--epochs", type=int, default=6, help="epochs of each speed run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS), help="speed models (gcn,sage,gat)")
    ap.add_argument("--ranks", default="1,2,4", help="speed rank counts (from 1, 2, 4)")
    ap.add_argument("--products", action="store_true", help="add products-synth at P=4")
    ap.add_argument("--products-root", default="/tmp/fg-data/data")
    ap.add_argument("--products-parts", help="an existing 4-part partition of products-synth")
    ap.add_argument("--datasets", help="comma-separated accuracy datasets (default all)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default="/tmp/fg-precision")
    a = ap.parse_args(argv)
    csv = CSVWriter(Path(a.out) / "precision.csv")
    if a.part in ("accuracy", "all"):
        accuracy(a, csv)
    if a.part in ("speed", "all"):
        speed(a, csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
