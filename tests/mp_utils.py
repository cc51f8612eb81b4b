"""Launching ``mpirun`` jobs from tests: the child's output becomes the failure message."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "mp_worker.py"


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
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    try:
        proc = subprocess.run(
            mpi_command(ranks, args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"mpirun -n {ranks} timed out after {timeout} s\n{out}\n{err}")
    if expect_ok and proc.returncode != 0:
        pytest.fail(
            f"mpirun -n {ranks} {' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
    return proc


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch and numba single-threaded (their OpenMP pools spin against each other)."""
    import numba
    import torch

    saved = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        numba.set_num_threads(saved[1])
