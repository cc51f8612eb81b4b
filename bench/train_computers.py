"""``bench.train --case computers``: one process against 2 ranks on Amazon Computers.

The case a new user tries first: the real ``fullgraph train`` on a real dataset, one process
(``--dataset``, the default threads: all cores) against ``mpirun -n 2`` (one thread each, parts
written by ``fullgraph partition``), GCN / GraphSAGE / GAT at the command's defaults, 20 epochs,
the median epoch from ``--log-json``. Configurations run interleaved, ``--rounds`` times, so a
change in the machine's load falls on all of them alike; ``--busy N`` keeps N busy-looping
processes running throughout (a loaded machine, as CI is). Also timed: one process with one
thread, and one process with ``OMP_WAIT_POLICY=ACTIVE`` (OpenMP threads spin between parallel
regions: what every one-process run did before ``fullgraph`` set its wait policy before torch
loaded).

Writes ``OUT/train_computers.csv`` and prints the table of medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.child import run_checked
from bench.common import CSVWriter, median

BIN = Path(sys.executable).parent
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
DATASET = "amazon-computers"

#: (name, ranks, threads, extra environment) of every configuration.
CONFIGS: list[tuple[str, int, int, dict[str, str]]] = [
    ("1 process, all threads", 1, 0, {}),
    ("1 process, all threads, spinning OpenMP", 1, 0, {"OMP_WAIT_POLICY": "ACTIVE"}),
    ("1 process, 1 thread", 1, 1, {}),
    ("2 ranks x 1 thread", 2, 1, {}),
]


def _busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes that spin until killed (the load of a shared machine)."""
    loop = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


def _epoch_ms(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    run_checked(cmd, env={**os.environ, **env}, timeout=1800)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return 1000.0 * median(r["epoch_s"] for r in recs if "epoch_s" in r)


def run_case(a: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    """Run every model and configuration ``a.rounds`` times, interleaved; epoch ms of each."""
    work = Path(tempfile.mkdtemp(prefix="fg-computers-"))
    parts = work / "parts2"
    run_checked(
        [str(BIN / "fullgraph"), "partition", "--dataset", DATASET, "--root", a.computers_root]
        + ["--parts", "2", "--out", str(parts)],
        timeout=600,
    )
    times: dict[tuple[str, str], list[float]] = {}
    busy = _busy(a.busy)
    try:
        for _ in range(a.rounds):
            for model in a.models.split(","):
                for name, ranks, threads, env in CONFIGS:
                    log = work / "log.json"
                    cmd = [str(BIN / "fullgraph"), "train", "--model", model, "--epochs", "20"]
                    cmd += ["--log-json", str(log), "--force", "--quiet"]
                    if threads:
                        cmd += ["--threads", str(threads)]
                    if ranks == 1:
                        cmd += ["--dataset", DATASET, "--root", a.computers_root]
                    else:
                        cmd = [str(BIN / "mpirun"), "-n", str(ranks), *cmd, "--parts", str(parts)]
                    times.setdefault((model, name), []).append(_epoch_ms(cmd, log, env))
    finally:
        for p in busy:
            p.kill()
    return times


def report(a: argparse.Namespace, times: dict[tuple[str, str], list[float]]) -> None:
    """Print the table (median over rounds, and every round) and write the CSV rows."""
    csv = CSVWriter(Path(a.out) / "train_computers.csv")
    load = f"{a.busy} busy loop(s)" if a.busy else "no added load"
    print(f"\n{DATASET}, {os.cpu_count()} cores, {load}: median epoch (ms), {a.rounds} rounds")
    print("| model | configuration | median over rounds | every round |")
    print("|---|---|---|---|")
    for (model, name), values in times.items():
        ranks = 2 if name.startswith("2 ranks") else 1
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {model} | {name} | {median(values):.0f} | {shown} |")
        csv.write(
            f"{DATASET}-{model}-busy{a.busy}", name, "epoch", "ms", a.busy, median(values), ranks
        )


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The case's options (``bench.train`` takes them too)."""
    ap.add_argument("--computers-root", default=str(SHARED), help="root holding amazon_computers")
    ap.add_argument("--models", default="gcn,sage,gat")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes during the case")


def main(argv: list[str] | None = None) -> int:
    """Run the case on its own."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    report(a, run_case(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
