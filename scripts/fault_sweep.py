"""Sweep of faults and bad input, tried as a careless or hostile user would; counts the outcomes.

Every case runs the real command line (``fullgraph ...`` or ``mpirun -n P fullgraph ...``) in a
scratch copy of a small workspace (a synthetic dataset, a 2-part METIS partition, a finished
run's checkpoint and log, an ``.npz`` dataset) and is classified:

- ``clean``: what was expected happened: for bad input one line naming the problem (argparse's
  usage block and MPI's own abort line aside), the expected exit status, no traceback;
- ``unclear``: it failed, but with a traceback, several lines or another exit status;
- ``hang``: it did not end within the case's time limit;
- ``running``: it ended, but a process it started (a rank) still runs in its directory;
- ``silent``: bad input accepted (exit 0);
- ``debris``: temporaries (``.*.tmp-*``) left behind (after the follow-up run, where a case
  has one);
- ``lost``: a file the case protects (an earlier result) changed or vanished.

The cases are data: one table per family in ``scripts/sweep/tables/`` (a ``Row`` each: name,
command template, expectation, setup steps, signal); ``scripts/sweep/runner.py`` runs and
classifies them.

Usage::

    python scripts/fault_sweep.py [--work DIR] [--csv runs/faults.csv] [--only 'SUBSTRING|...']
    python scripts/fault_sweep.py --list [--only 'SUBSTRING|...']

Prints one line per case and the counts; ``--csv`` writes them too; ``--list`` prints the case
names only. Exit status 1 when any case is not clean.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from sweep.build import cases
from sweep.records import Case
from sweep.runner import OUTCOMES, run_case
from sweep.workspace import build_workspace

__all__ = ["Case", "build_workspace", "cases", "main", "run_case"]


def main() -> int:
    """Build the workspace, run every case (or those matching ``--only``), print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )
    parser.add_argument("--csv", type=Path, default=None, help="write one row per case here")
    parser.add_argument(
        "--only", default="", help="run the cases whose name contains this ('a|b': either)"
    )
    parser.add_argument("--list", action="store_true", help="print the case names, run nothing")
    args = parser.parse_args()
    chosen = [
        case
        for case in cases()
        if not args.only or any(part in case.name for part in args.only.split("|"))
    ]
    if args.list:
        print("\n".join(case.name for case in chosen))
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="fullgraph-faults-"))
    base = work / "base"
    if not (base / "p2" / "meta.json").exists():
        print(f"building the workspace in {base} ...", flush=True)
        shutil.rmtree(base, ignore_errors=True)
        build_workspace(base)
    rows = []
    counts: Counter[str] = Counter()
    for case in chosen:
        outcome, detail = run_case(case, base, work / "cases")
        for _ in range(2):  # a signal that came after the end measured nothing: run it again
            if outcome != "late":
                break
            outcome, detail = run_case(case, base, work / "cases")
        counts[outcome] += 1
        rows.append((case.name, outcome, detail))
        print(f"{outcome:8s} {case.name:50s} {detail}", flush=True)
    total = sum(counts.values())
    summary = ", ".join(f"{k} {counts.get(k, 0)}" for k in OUTCOMES)
    print(f"\n{total} cases: {summary}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["case", "outcome", "detail"])
            writer.writerows(rows)
    return 0 if counts.get("clean", 0) == total else 1


if __name__ == "__main__":
    sys.exit(main())
