"""The process watchdog: SIGTERM in native code, phase deadlines, a launcher that dies.

Each case runs a small Python process that installs :class:`fullgraph.watchdog.Watchdog` and
then waits in native code that signals do not interrupt: libc's ``system`` through ctypes
(which releases the GIL, as ``MPI_Init_thread`` does in :func:`fullgraph.distributed.mpi.
init_mpi`; ``system`` resumes its ``waitpid`` after a signal) running a shell that says "ready"
and reads its standard input. The test waits for that "ready", never for a fixed time, and ends
the shell by closing the input.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_utils import gone, wait_until

from fullgraph.watchdog import TERM_GRACE_S, Watchdog, phase

#: A process that installs the watchdog, attaches it to the launch its environment describes,
#: enters phase PHASE with deadline LIMIT (none when empty) and waits in C, where a shell it
#: started says "ready" and waits for the end of its input.
RANK = """
import ctypes, sys
from fullgraph.distributed.launch import detect_launch
from fullgraph.watchdog import Watchdog
watchdog = Watchdog("fullgraph test").install()
watchdog.attach(detect_launch(), timeout_s=1.0)
with watchdog.phase(sys.argv[1], float(sys.argv[2]) if sys.argv[2] else None):
    ctypes.CDLL(None).system(b"echo ready; read line")
"""

ROOT = Path(__file__).resolve().parents[1]


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n", proc.stderr
    return proc


def _finish(proc: subprocess.Popen) -> str:
    """Wait for ``proc`` to end by itself, then end its shell; its standard error."""
    proc.wait(timeout=30)
    return proc.communicate(timeout=30)[1]  # closes the input: the shell ends


@pytest.mark.timeout(60)
def test_sigterm_in_native_code_ends_the_process_with_its_line() -> None:
    proc = _start(["sleeping", ""])
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    err = _finish(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert time.monotonic() - t0 < TERM_GRACE_S + 3, err
    assert err.splitlines() == ["fullgraph test: terminated (SIGTERM)"], err


@pytest.mark.timeout(60)
def test_sigterm_in_native_code_on_a_rank_of_several_dies_of_the_signal() -> None:
    """A rank of a job of two (MPI not up) that the watchdog ends on SIGTERM dies of the signal
    itself after its line, so that its launcher ends the other ranks (hydra waits for ever on
    a rank that exits with a status before MPI initialisation)."""
    proc = _start(["sleeping", ""], env={"PMI_RANK": "0", "PMI_SIZE": "2"})
    proc.send_signal(signal.SIGTERM)
    err = _finish(proc)
    assert proc.returncode == -signal.SIGTERM, err
    assert err.splitlines() == ["fullgraph test: rank 0 terminated (SIGTERM)"], err


@pytest.mark.timeout(60)
def test_a_phase_past_its_deadline_ends_the_rank_naming_a_stopped_peer() -> None:
    """Rank 1, a child of the same launcher (here: this test, which kills no rank), is
    stopped; rank 0's phase outlasts its deadline: one line names the phase and the stopped
    rank, exit status 4, and rank 1 is killed (no MPI_Abort reaches it before MPI is up)."""
    job = {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}
    peer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, **job, "PMI_RANK": "1", "MPI_LOCALRANKID": "1"},
    )
    try:
        peer.send_signal(signal.SIGSTOP)
        proc = _start(["MPI initialisation", "1"], {**job, "PMI_RANK": "0", "MPI_LOCALRANKID": "0"})
        err = _finish(proc)
        wait_until(lambda: peer.poll() is not None, 30, "the stopped rank to be killed")
    finally:
        peer.kill()
        peer.wait()
    assert peer.returncode == -signal.SIGKILL
    assert proc.returncode == 4, err
    assert err.splitlines() == [
        f"fullgraph test: error: rank 0: MPI initialisation did not finish within 1 s; "
        f"rank 1 (pid {peer.pid}) is stopped"
    ], err


@pytest.mark.timeout(60)
def test_a_missing_peer_is_named_when_every_rank_is_on_this_node() -> None:
    env = {"PMI_SIZE": "3", "MPI_LOCALNRANKS": "3", "PMI_RANK": "0", "MPI_LOCALRANKID": "0"}
    proc = _start(["part loading", "0.5"], env)
    err = _finish(proc)
    assert proc.returncode == 4, err
    assert "part loading did not finish within 0.5 s; rank 1 is not running" in err, err
    assert "rank 2 is not running (it exited or never started)" in err, err


#: A launcher: starts RANK (the arguments) as its child with the environment given, writes the
#: child's pid, then waits for it.
LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("launcher", ["torchrun", "none"])
def test_a_rank_ends_when_its_launcher_dies_and_only_then(launcher: str) -> None:
    """A rank started by torchrun (its variables) ends within a second of the launcher's
    SIGKILL, saying so; a process without launcher variables (started from a shell) stays."""
    env = {**os.environ}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "PMI_RANK", "SLURM_PROCID"):
        env.pop(name, None)
    if launcher == "torchrun":
        env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", LOCAL_WORLD_SIZE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, RANK, "sleeping", ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    rank = int(proc.stdout.readline())
    assert proc.stdout.readline() == "ready\n"
    proc.kill()
    proc.wait()
    try:
        if launcher == "torchrun":
            wait_until(lambda: gone(rank), 5.0, "the rank to end after its launcher")
            assert proc.stdin is not None and proc.stderr is not None
            proc.stdin.close()  # ends the shell
            err = proc.stderr.read()
            assert err.splitlines() == [
                f"fullgraph test: error: the launcher that started this rank (torchrun, pid "
                f"{proc.pid}) is gone; ending the rank"
            ], err
        else:
            deadline = time.monotonic() + 2.0  # eight times the watchdog's poll
            while time.monotonic() < deadline:
                assert not gone(rank), "a process no launcher started was ended"
                time.sleep(0.1)
    finally:
        if not gone(rank):
            os.kill(rank, signal.SIGKILL)
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()


def test_install_and_uninstall_restore_the_process_state() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before[1])
    watchdog = Watchdog("fullgraph test").install()
    try:
        assert signal.getsignal(signal.SIGTERM) == watchdog._on_sigterm
        with phase("part loading", 100.0):  # the module-level helper reaches it
            assert [p.what for p in watchdog._phases] == ["part loading"]
        assert watchdog._phases == []
    finally:
        watchdog.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before[0]
    assert signal.set_wakeup_fd(-1) == before[1]
    signal.set_wakeup_fd(before[1])
    with phase("nothing watches this"):  # without a watchdog: nothing happens
        pass
