"""Launching ``mpirun`` jobs from tests: the child's output becomes the failure message.

Tests that signal or stop a rank wait for a state, never for a fixed time (:func:`wait_until`):
the ranks of a launcher (:func:`rank_pids`), a SIGTERM handler installed
(:func:`handles_sigterm`), a line in a log, a process gone (:func:`gone`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def mpirun_path() -> str:
    """The ``mpirun`` beside this Python (the mpich wheel's), else the one on PATH.

    A missing ``mpirun`` fails the test instead of skipping it: the distributed tests are the
    ones that matter, and CI must not pass without them.
    """
    local = Path(sys.executable).parent / "mpirun"
    found = str(local) if local.exists() else shutil.which("mpirun")
    if not found:
        pytest.fail("no mpirun found: install the mpich extra (pip install -e '.[mpich]')")
    return found


def mpi_command(ranks: int, args: list[str]) -> list[str]:
    """``mpirun -n ranks python args...`` (MPICH hydra; runs as root and oversubscribed)."""
    return [mpirun_path(), "-n", str(ranks), sys.executable, *args]


def run_mpi(
    ranks: int,
    args: list[str],
    timeout: float = 120.0,
    expect_ok: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run ``args`` under ``mpirun -n ranks``; on an unexpected status fail with its output.

    Args:
        ranks: number of ranks.
        args: the Python arguments (script and its options).
        timeout: seconds before the job is killed and the test fails.
        expect_ok: fail when the exit status is non-zero (else return whatever happened).
        env: extra environment variables.

    Returns:
        The completed process (stdout and stderr captured as text).
    """
    return _run(mpi_command(ranks, args), f"mpirun -n {ranks}", args, timeout, expect_ok, env)


def run_python(
    args: list[str],
    timeout: float = 120.0,
    expect_ok: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python args`` as one process, no launcher; otherwise as :func:`run_mpi`."""
    return _run([sys.executable, *args], "python", args, timeout, expect_ok, env)


def _run(
    cmd: list[str],
    label: str,
    args: list[str],
    timeout: float,
    expect_ok: bool,
    env: dict | None,
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"{label} timed out after {timeout} s\n{out}\n{err}")
    if expect_ok and proc.returncode != 0:
        pytest.fail(
            f"{label} {' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


@contextlib.contextmanager
def threads_restored() -> Iterator[None]:
    """Give torch and numba back their thread counts after the body (which may set them)."""
    import numba
    import torch

    saved = torch.get_num_threads(), numba.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        numba.set_num_threads(saved[1])


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch and numba single-threaded (their OpenMP pools spin against each other)."""
    import numba
    import torch

    with threads_restored():
        torch.set_num_threads(1)
        numba.set_num_threads(1)
        yield


def wait_until(ready: Callable[[], object], timeout: float, what: str) -> object:
    """Poll ``ready()`` until it returns something true; fail the test after ``timeout`` s.

    Returns:
        What ``ready()`` returned.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {what}")
        time.sleep(0.05)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from ``/proc``, or ``None`` when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return state, int(ppid)


def parent_of(pid: int) -> int | None:
    """The parent process of ``pid``, or ``None`` when ``pid`` does not exist."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (absent, or a zombie nobody reaped yet)."""
    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def descendants(root: int) -> list[int]:
    """Every living process below ``root``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _rank_of(pid: int) -> int | None:
    """The rank a launcher gave ``pid`` (``PMI_RANK`` of hydra, ``RANK`` of torchrun), if any."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if b"fullgraph" not in cmdline and b"pyg" not in cmdline:
        return None
    for item in env:
        name, _, value = item.partition(b"=")
        if name in (b"PMI_RANK", b"RANK") and value.isdigit():
            return int(value)
    return None


def rank_pids(root: int, ranks: int, timeout: float = 120.0) -> dict[int, int]:
    """rank -> pid of the ``ranks`` rank processes a launcher (pid ``root``) started, waiting
    until they all exist."""

    def found() -> dict[int, int] | None:
        pids = {r: p for p in descendants(root) if (r := _rank_of(p)) is not None}
        return pids if len(pids) == ranks else None

    return wait_until(found, timeout, f"{ranks} rank processes under pid {root}")  # type: ignore[return-value]


def handles_sigterm(pid: int) -> bool:
    """Whether ``pid`` has a handler for SIGTERM installed (``SigCgt`` of ``/proc``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def lines_of(path: Path) -> list[str]:
    """The complete lines of a file being written (none while it does not exist)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return text.splitlines()[: text.count("\n")]
