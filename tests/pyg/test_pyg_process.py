"""The process of a ``fullgraph.pyg`` script: how it ends, and its OpenMP wait policy.

- A rank that stalls in the script's own code (before the first collective, mid-training, at
  the loss; over mpi and gloo) or raises ends the whole job: one line from the rank that
  noticed, ``mpirun`` non-zero, no rank left running (issue 31: rank 0 printed the timeout and
  the job never ended).
- A rank stopped before it starts (before ``load_part``): rank 0 ends the job with the line a
  ``fullgraph`` command prints (the rank start-up is theirs, ``run/rank_start.py``).
- ``load_part`` of a wrong thing under ``mpirun``: one line, every rank ends with status 1.
- ``import fullgraph.pyg`` before torch sets ``OMP_WAIT_POLICY=PASSIVE`` (it takes effect: no
  CPU spent by idle OpenMP threads); after torch it cannot, and rank 0 says so once.

Enters through :mod:`fullgraph.pyg.process`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_utils import run_mpi, wait_until

pytest.importorskip("torch_geometric.nn")

import pyg_worker

TESTS = Path(__file__).resolve().parents[1]
WORKER = str(Path(pyg_worker.__file__))
#: Seconds every collective of the stalled jobs may wait.
TIMEOUT_S = 5


def _left_running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (a job's unique output path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def _none_left(marker: str) -> None:
    """Wait (30 s at most) until no process of the job is left: a rank killed by the abort may
    still be exiting when ``mpirun`` returns."""
    wait_until(lambda: not _left_running(marker), 30, f"the ranks of {marker} to end")


def _job(args: list[str], out: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    proc = run_mpi(2, [WORKER, "--out", str(out), *args], timeout=150, expect_ok=False, env=env)
    return proc, time.monotonic() - start


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fullgraph.pyg:")]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("where", "transport", "collective"),
    [
        ("epoch", "mpi", "all-to-all"),
        ("before", "gloo", "all-gather"),
        ("loss", "mpi", "all-reduce"),
        ("loss", "gloo", "all-reduce"),
    ],
)
def test_a_stalled_rank_ends_the_job(where, transport, collective, tmp_path) -> None:
    out = tmp_path / f"stall-{where}-{transport}.npz"
    args = ["--task", "stall", "--where", where, "--transport", transport]
    proc, took = _job([*args, "--timeout", str(TIMEOUT_S)], out)
    errors = [line for line in _errors(proc.stderr) if "error" in line]
    assert proc.returncode == 4, proc.stderr
    want = f"fullgraph.pyg: error: rank 0: {collective} did not complete within {TIMEOUT_S} s"
    assert len(errors) == 1 and errors[0].startswith(want), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert took < 120, f"the job took {took:.0f} s"
    assert not out.exists()
    _none_left(str(out))


#: A script whose rank 1 stops itself (SIGSTOP, as a debugger would) before ``load_part``:
#: rank 0 is left alone in the rank start-up the commands share (run/rank_start.py).
STOPS_BEFORE_LOAD_PART = """
import os, signal, sys
from conftest import build_sbm_graph
from fullgraph import pyg
if os.environ["PMI_RANK"] == "1":
    os.kill(os.getpid(), signal.SIGSTOP)
pyg.load_part(build_sbm_graph(), threads=1, timeout=float(sys.argv[1]))
"""


@pytest.mark.timeout(200)
def test_a_rank_stopped_before_its_start_up_ends_the_job_as_the_cli(tmp_path) -> None:
    """Rank 0's line is the one ``fullgraph train`` prints when a peer stopped before MPI
    started (tests/commands/test_run_faults.py), labelled ``fullgraph.pyg``; status 4."""
    script = tmp_path / "stops_early.py"
    script.write_text(STOPS_BEFORE_LOAD_PART)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = run_mpi(2, [str(script), str(TIMEOUT_S)], timeout=150, expect_ok=False, env=env)
    errors = [line for line in _errors(proc.stderr) if "error" in line]
    assert proc.returncode == 4, proc.stderr
    want = (
        rf"fullgraph.pyg: error: rank 0: MPI initialisation did not finish within {TIMEOUT_S} s; "
        r"rank 1 \(pid \d+\) is stopped"
    )
    assert len(errors) == 1 and re.fullmatch(want, errors[0]), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    _none_left(str(script))


@pytest.mark.timeout(200)
def test_an_exception_on_one_rank_ends_the_job(tmp_path) -> None:
    out = tmp_path / "raise.npz"
    proc, _ = _job(["--task", "stall", "--where", "raise", "--timeout", "60"], out)
    assert proc.returncode == 1, proc.stderr
    assert "fullgraph.pyg: rank 1 failed:" in proc.stderr, proc.stderr
    assert "ValueError: a bug in the script on rank 1" in proc.stderr
    _none_left(str(out))


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("int", "load_part: got int 42; give a partition directory"),
        ("missing", "load_part: 'parts/not-there-4' does not exist; give a partition directory"),
        ("no_y", "load_part: the PyG Data has no labels (y): Data(edge_index [2, "),
    ],
)
def test_load_part_of_a_wrong_thing_is_one_line(what, message, tmp_path) -> None:
    out = tmp_path / f"wrong-{what}.npz"
    proc, _ = _job(["--task", "load_wrong", "--what", what], out)
    assert proc.returncode == 1, proc.stderr
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and errors[0].startswith(f"fullgraph.pyg: error: {message}"), errors
    assert "Traceback" not in proc.stderr, proc.stderr
    _none_left(str(out))


#: Prints the wait policy the process's environment holds after the imports, and the CPU time
#: the process spent while its main thread slept after a parallel operator (idle OpenMP
#: threads spin with the default policy; with PASSIVE they sleep).
PROBE = """\
{first}
import os, resource, time
import torch
from fullgraph import pyg
torch.set_num_threads(2)
a = torch.randn(1000, 1000)
for _ in range(3):
    (a * 2).sum()
r0 = resource.getrusage(resource.RUSAGE_SELF)
time.sleep(1.0)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(os.environ.get("OMP_WAIT_POLICY"), r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
from conftest import build_sbm_graph
pyg.load_part(build_sbm_graph(), threads={threads})
"""


def _probe(first: str, threads: int, env: dict[str, str] | None = None) -> tuple[str, float, str]:
    script = PROBE.format(first=first, threads=threads)
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    base["PYTHONPATH"] = str(TESTS)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    policy, cpu = proc.stdout.split()[-2:]
    return policy, float(cpu), proc.stderr


def test_importing_fullgraph_pyg_first_sets_the_wait_policy() -> None:
    policy, _, err = _probe("from fullgraph import pyg", threads=2)
    assert policy == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in err, err


def test_after_torch_the_wait_policy_line_is_printed_once() -> None:
    policy, _, err = _probe("import torch", threads=2)
    assert policy == "None"
    lines = [line for line in err.splitlines() if "OMP_WAIT_POLICY is not set" in line]
    assert len(lines) == 1 and "OMP_WAIT_POLICY=PASSIVE python SCRIPT" in lines[0], err
    _, _, err = _probe("import torch", threads=1)  # one thread never waits for a sibling
    assert "OMP_WAIT_POLICY" not in err, err
    _, _, err = _probe("import torch", threads=2, env={"OMP_WAIT_POLICY": "PASSIVE"})
    assert "OMP_WAIT_POLICY" not in err, err


def test_a_policy_set_after_torch_has_no_effect() -> None:
    """Why the line is needed: GNU OpenMP read the policy when torch loaded it. ``ACTIVE``
    set before torch spins the idle thread through the sleep; set after, it does not."""
    _, before, _ = _probe("import os; os.environ['OMP_WAIT_POLICY'] = 'ACTIVE'", threads=1)
    _, after, _ = _probe("import torch, os; os.environ['OMP_WAIT_POLICY'] = 'ACTIVE'", threads=1)
    assert before > 0.05, before  # an idle thread spinning (a share of a core on a busy machine)
    assert after < 0.03, after  # nothing spins: the default policy sleeps after a short spin
