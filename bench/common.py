"""Shared pieces of the benchmarks: long-format CSV rows, machine and revision stamps, timing.

Every benchmark appends rows with the columns of :data:`FIELDS` so that one plotting module
(``python -m bench.plot FILE.csv``) can turn any result file into charts. Only the standard
library is imported here: ``bench.gpu_check`` reads the stamps on a machine whose torch may not
import.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

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


def tests_module(name: str) -> ModuleType:
    """``tests/<name>.py``, imported once as module ``name`` (``tests/`` is not a package; a
    benchmark uses the tests' helpers without adding ``tests/`` to the import path)."""
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "tests" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def command_line() -> str:
    """The command that reproduces this run: ``python -m bench.NAME ARGS`` for a benchmark
    started as a module (from the repository root), else ``python SCRIPT ARGS``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    run = ["-m", spec.name] if spec is not None and spec.name else sys.argv[:1]
    return shlex.join([Path(sys.executable).name, *run, *sys.argv[1:]])


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
    from fullgraph.kernels.cpu_launch import set_threads

    release_freed_memory()
    set_threads(threads)
