"""A benchmark's child processes: how they are started and how their figures come back.

A benchmark measures in a fresh process where it matters (a peak RSS of that run alone; one
process per rank under ``mpirun``). The child is a benchmark module again, started with
:func:`bench_command` (``python -m bench.NAME --worker ...``, the repository root on its
``PYTHONPATH``: :func:`child_env`); it prints its figures as one ``RESULT {json}`` line
(:func:`emit_result`) and the parent reads them with :func:`run_child`. A child that fails,
times out or prints no ``RESULT`` line stops the benchmark with :class:`ChildFailed`, whose
message holds the command and the tail of the child's output.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What starts the line of a child's figures.
PREFIX = "RESULT "
#: Characters of a failed child's stdout and of its stderr kept in the error.
TAIL_CHARS = 3000


class ChildFailed(SystemExit):
    """A child process failed, timed out or printed no ``RESULT`` line.

    A ``SystemExit``: the benchmark stops with the message (the command and the tail of the
    child's output) and exit status 1, and no ``except Exception`` swallows it.
    """


def bench_command(module: str, *args: str) -> list[str]:
    """``python -m bench.<module> ARGS`` with this interpreter (how a benchmark starts its
    workers, directly or after ``mpirun -n P``)."""
    return [sys.executable, "-m", f"bench.{module}", *args]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, ``extra`` on top, the repository root first on
    ``PYTHONPATH``: ``-m bench.NAME`` imports wherever a launcher starts the child."""
    env = {**os.environ, **(extra or {})}
    path = [str(REPO), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    return env


def emit_result(result: Mapping[str, object]) -> None:
    """Print ``result`` as the child's ``RESULT {json}`` line (flushed)."""
    print(PREFIX + json.dumps(result), flush=True)


def read_result(stdout: str) -> dict | None:
    """The last ``RESULT`` line of ``stdout`` as a dict; ``None`` when there is none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX) :])
    return None


def _text(output: str | bytes | None) -> str | None:
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def _failure(cmd: Sequence[str], why: str, stdout: str | None, stderr: str | None) -> ChildFailed:
    parts = [f"{why}: {shlex.join(cmd)}"]
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if text:
            parts.append(f"--- {name} (last {TAIL_CHARS} characters) ---\n{text[-TAIL_CHARS:]}")
    return ChildFailed("\n".join(parts))


def run_checked(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end, output captured as text; :class:`ChildFailed` when it exits
    non-zero or runs past ``timeout`` seconds.

    Args:
        cmd: the argv.
        env: the child's environment (default :func:`child_env`).
        timeout: seconds, or ``None`` for no limit.
    """
    env = child_env() if env is None else dict(env)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out, err = (_text(s) for s in (exc.stdout, exc.stderr))  # bytes on POSIX
        raise _failure(cmd, f"timed out after {timeout:g} s", out, err) from None
    if proc.returncode != 0:
        raise _failure(cmd, f"failed (exit status {proc.returncode})", proc.stdout, proc.stderr)
    return proc


def run_child(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    echo: bool = False,
) -> dict:
    """Run a child that prints a ``RESULT {json}`` line; return that dict (the last such line).

    Args:
        cmd: the argv (:func:`bench_command`, perhaps after ``mpirun -n P``).
        env: the child's environment (default :func:`child_env`).
        timeout: seconds, or ``None`` for no limit.
        echo: print the command before, and its wall time and result after.

    Raises:
        ChildFailed: the child exited non-zero, timed out or printed no ``RESULT`` line.
    """
    if echo:
        print("  $ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = run_checked(cmd, env=env, timeout=timeout)
    result = read_result(proc.stdout)
    if result is None:
        raise _failure(cmd, f"printed no {PREFIX.strip()} line", proc.stdout, proc.stderr)
    if echo:
        print(f"    {time.perf_counter() - t0:.0f} s: {result}", flush=True)
    return result
