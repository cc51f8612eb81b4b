"""Epoch time of two revisions of this repository, interleaved in one run: is a change slower?

Each revision is checked out once into its own git worktree (``git worktree add --detach``),
with ``fullgraph/kernels``, ``fullgraph/partition`` and ``fullgraph/datasets`` linked to the
worktree's own top-level folders, and runs with ``PYTHONPATH`` set to it, so that every import
(the three top-level packages included) comes from that revision; the virtual environment is
this one's. Every round runs, for each revision in turn, the real ``fullgraph train`` on a real
dataset for each model: one process (all threads) and ``mpirun -n 2`` (one thread each) on a
2-part partition written once by the newer revision. The median epoch (epochs 2 onwards, from
``--log-json``) of each configuration is the median over rounds; interleaving makes a change
in the machine's load fall on both revisions alike.

Usage: ``python -m bench.revisions --before REV --after REV [--rounds 4] [--epochs 30]
[--models gcn,sage] [--dataset amazon-computers] [--root ../shared/datasets]
[--out bench/results]``. Writes ``OUT/revisions.csv`` (long format, bench/common.py) and prints
the table with ``lscpu``'s model name.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import CSVWriter, machine_name, median

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHARED = ROOT.parent / "shared" / "datasets"
#: The top-level packages the installed project maps under ``fullgraph.``.
MAPPED = ("kernels", "partition", "datasets")
CLI = "import sys; from fullgraph.cli import main; sys.argv[0] = 'fullgraph'; sys.exit(main())"


def checkout(rev: str, where: Path) -> Path:
    """A worktree of ``rev`` at ``where`` whose ``fullgraph.*`` packages are its own."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), rev], check=True
    )
    for name in MAPPED:
        link = where / "fullgraph" / name
        if not link.exists():
            link.symlink_to(Path("..") / name)
    return where


def fullgraph(tree: Path, *args: str) -> list[str]:
    """The ``fullgraph`` command line of ``tree``'s code (run with ``PYTHONPATH=tree``)."""
    return [str(BIN / "python"), "-c", CLI, *args]


def epoch_ms(cmd: list[str], tree: Path, log: Path) -> float:
    """Run ``cmd`` with ``tree``'s code; the median epoch of its log after the first, in ms."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[3:])} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    epochs = [r["epoch_s"] for r in records if "epoch_s" in r][1:]
    return 1000.0 * median(epochs)


def run(a: argparse.Namespace, work: Path) -> dict[tuple[str, str, int], list[float]]:
    """Every revision, model and rank count, ``a.rounds`` times interleaved: epoch ms each."""
    trees = {rev: checkout(rev, work / f"tree-{i}") for i, rev in enumerate((a.before, a.after))}
    parts = work / "parts2"
    data = ["--dataset", a.dataset, "--root", a.root]
    newer = trees[a.after]
    part_cmd = fullgraph(newer, "partition", *data, "--parts", "2", "--out", str(parts))
    subprocess.run(part_cmd, env={**os.environ, "PYTHONPATH": str(newer)}, check=True)
    times: dict[tuple[str, str, int], list[float]] = {}
    log = work / "log.jsonl"
    for r in range(a.rounds):
        for rev, tree in trees.items():
            for model in a.models.split(","):
                for ranks in (1, 2):
                    train = ["train", "--model", model, "--epochs", str(a.epochs), "--quiet"]
                    train += ["--log-json", str(log), "--force"]
                    if ranks == 1:
                        cmd = fullgraph(tree, *train, *data)
                    else:
                        cmd = [str(BIN / "mpirun"), "-n", "2"]
                        cmd += fullgraph(tree, *train, "--threads", "1", "--parts", str(parts))
                    ms = epoch_ms(cmd, tree, log)
                    times.setdefault((rev, model, ranks), []).append(ms)
                    print(f"round {r + 1}: {rev} {model} P={ranks}: {ms:.1f} ms", flush=True)
    return times


def report(a: argparse.Namespace, times: dict[tuple[str, str, int], list[float]]) -> None:
    """Print the table (medians over rounds, after / before) and write the CSV rows."""
    csv = CSVWriter(Path(a.out) / "revisions.csv")
    print(f"\n{a.dataset}, {machine_name()}, {os.cpu_count()} cores: median epoch (ms)")
    print(f"| model | P | {a.before} | {a.after} | after / before |")
    print("|---|---|---|---|---|")
    for model in a.models.split(","):
        for ranks in (1, 2):
            before = median(times[(a.before, model, ranks)])
            after = median(times[(a.after, model, ranks)])
            print(f"| {model} | {ranks} | {before:.1f} | {after:.1f} | {after / before:.3f} |")
            for rev, value in ((a.before, before), (a.after, after)):
                csv.write(f"{a.dataset}-{model}", rev, "epoch", "ms", ranks, value, ranks)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run both revisions interleaved, report, remove the worktrees."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the older revision (any git rev)")
    ap.add_argument("--after", default="HEAD", help="the newer revision (default HEAD)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--dataset", default="amazon-computers")
    ap.add_argument("--root", default=str(SHARED), help="dataset root (read only)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.epochs < 2:
        ap.error("--rounds must be at least 1 and --epochs at least 2")
    work = Path(tempfile.mkdtemp(prefix="fg-revisions-"))
    try:
        report(a, run(a, work))
    finally:
        for tree in sorted(work.glob("tree-*")):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
