"""Shared pieces of the benchmarks: long-format CSV rows, machine and revision stamps, timing.

Every benchmark appends rows with the columns of :data:`FIELDS` so that one plotting script
(`bench/plot.py`) can turn any result file into charts.
"""

from __future__ import annotations

import csv
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

FIELDS = ["what", "provider", "metric", "unit", "x", "y", "ranks", "machine", "git_rev", "command"]


def git_revision() -> str:
    """Short git revision of the checkout (with ``+dirty`` when files changed), or ``unknown``."""
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return (rev or "unknown") + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def machine_name() -> str:
    """A short description of this machine: CPU model, core count, torch threads."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} x{os.cpu_count()}"


def command_line() -> str:
    """The command that reproduces this run."""
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


class CSVWriter:
    """Appends long-format benchmark rows to a CSV file (header written once)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.machine = machine_name()
        self.git_rev = git_revision()
        self.command = command_line()

    def write(
        self,
        what: str,
        provider: str,
        metric: str,
        unit: str,
        x: object,
        y: float,
        ranks: int = 1,
    ) -> None:
        """Append one row: ``provider`` measured ``metric`` = ``y`` ``unit`` at ``x``."""
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                w.writeheader()
            w.writerow(
                {
                    "what": what,
                    "provider": provider,
                    "metric": metric,
                    "unit": unit,
                    "x": x,
                    "y": y,
                    "ranks": ranks,
                    "machine": self.machine,
                    "git_rev": self.git_rev,
                    "command": self.command,
                }
            )


def time_call(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> list[float]:
    """Run ``fn`` ``warmup`` times, then ``repeat`` times; return the wall times in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median(values: Iterable[float]) -> float:
    """Median of ``values``."""
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def setup_threads(threads: int) -> None:
    """Threads, and the environment and allocator settings ``fullgraph train`` makes (for
    every worker: what a benchmark times is what the command runs)."""
    from fullgraph.resources import process_defaults, release_freed_memory

    process_defaults()
    import numba
    import torch

    release_freed_memory()
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
