"""One rank start-up (``fullgraph/run/rank_start.py``) for the commands and ``fullgraph.pyg``.

- ``Command.execute`` and ``fullgraph.pyg``'s ``communicator`` both start their rank with
  ``start_rank``, each with its own label;
- ``start_rank`` applies the memory policy, tells the watchdog the rank, sets the threads
  (numba's and torch's) and ends the job with the label's line when a peer cannot be reached in
  the set-up;
- the lines a set-up error gives a ``fullgraph`` command and a ``fullgraph.pyg`` script are the
  same but for the label (as rank 0 of 2 under a hydra environment, no launcher needed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numba
import pytest
import torch
from mp_utils import threads_restored

import fullgraph.run.rank_start as rank_start
from fullgraph.distributed.launch import LaunchInfo
from fullgraph.errors import PeerUnreachable
from fullgraph.run.command import Command, Job
from fullgraph.run.options import RunOptions, RuntimeOptions

TESTS = Path(__file__).resolve().parents[1]


class _Probe(Command):
    """A command that only starts its rank."""

    name = "probe"

    def configure(self) -> None:
        self.runtime, self.io = RuntimeOptions(timeout=7.0), RunOptions(quiet=True)

    def run(self, job: Job) -> Any:
        return job.threads


@pytest.fixture
def saved_threads():
    with threads_restored():
        yield


def _one_process() -> LaunchInfo:
    from fullgraph.distributed import detect_launch

    return detect_launch()


def test_the_command_line_and_pyg_start_their_ranks_alike(monkeypatch, saved_threads) -> None:
    import fullgraph.resources
    from fullgraph.pyg import process

    calls: list[tuple[Any, ...]] = []
    real = rank_start.start_rank

    def spy(label, info, transport, timeout_s, threads, **kw):
        calls.append((label, transport, timeout_s, threads, kw))
        return real(label, info, transport, timeout_s, threads, **kw)

    monkeypatch.setattr(rank_start, "start_rank", spy)
    monkeypatch.setattr(fullgraph.resources, "process_defaults", lambda: None)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # communicator installs its own
    _Probe(argparse.Namespace()).execute()
    process.communicator(None, 9.0).close()
    assert calls == [
        ("fullgraph probe", "local", 7.0, None, {"notices": False}),
        ("fullgraph.pyg", "local", 9.0, None, {"keep_threads": True}),
    ]


def test_start_rank_sets_the_memory_policy_and_the_threads(monkeypatch, saved_threads) -> None:
    import fullgraph.resources

    released: list[bool] = []
    monkeypatch.setattr(fullgraph.resources, "release_freed_memory", lambda: released.append(1))
    comm, threads = rank_start.start_rank("fullgraph test", _one_process(), "local", 5.0, 1)
    comm.close()
    assert released and threads == 1 == torch.get_num_threads() == numba.get_num_threads()
    torch.set_num_threads(2)
    comm, threads = rank_start.start_rank(
        "fullgraph.pyg", _one_process(), "local", 5.0, None, keep_threads=True
    )
    comm.close()
    assert threads == 2 == torch.get_num_threads()  # one process keeps a script's setting


def test_start_rank_tells_the_watchdog_the_rank(monkeypatch, saved_threads) -> None:
    import fullgraph.watchdog

    attached: list[tuple[Any, ...]] = []

    class Watchdog:
        def attach(self, info, timeout_s, notices=False):
            attached.append((info.rank, timeout_s, notices))

    monkeypatch.setattr(fullgraph.watchdog, "current", Watchdog)
    rank_start.start_rank("fullgraph test", _one_process(), "local", 5.0, 1)[0].close()
    assert attached == [(0, 5.0, True)]


def test_a_set_up_peer_failure_ends_the_job_with_the_label(monkeypatch, saved_threads) -> None:
    import fullgraph.distributed
    import fullgraph.distributed.faults

    def unreachable(*args, **kwargs):
        raise PeerUnreachable("rendezvous 10.0.0.1:29500 did not answer within 5 s")

    ended: list[tuple[Any, ...]] = []
    monkeypatch.setattr(fullgraph.distributed, "create_communicator", unreachable)
    monkeypatch.setattr(
        fullgraph.distributed.faults,
        "abort_setup",
        lambda command, rank, under_mpi, exc, label=None: ended.append((rank, label, str(exc))),
    )
    info = LaunchInfo(rank=1, size=2, local_rank=1, local_size=2, launcher="torchrun")
    with pytest.raises(PeerUnreachable):  # (abort_setup never returns; here it does)
        rank_start.start_rank("fullgraph.pyg", info, "gloo", 5.0, 1)
    assert ended == [(1, "fullgraph.pyg", "rendezvous 10.0.0.1:29500 did not answer within 5 s")]


#: A ``fullgraph.pyg`` script: ``load_part`` of the tests' graph with ``--transport`` ARGV[1].
SCRIPT = """
import sys
from conftest import build_sbm_graph
from fullgraph import pyg
pyg.load_part(build_sbm_graph(), transport=sys.argv[1], timeout=10)
"""


def _as_rank(rank: int, size: int) -> dict[str, str]:
    """The environment of rank ``rank`` of ``size`` under hydra (no launcher runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "SLURM_", "OMPI_"))}
    env.update(PMI_RANK=str(rank), PMI_SIZE=str(size), MPI_LOCALRANKID=str(rank))
    env.update(MPI_LOCALNRANKS=str(size), PYTHONPATH=str(TESTS), OMP_NUM_THREADS="1")
    return env


def _errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if ": error: " in line]


def test_a_set_up_error_is_the_command_lines_line(small_partitions) -> None:
    """``--transport local`` with 2 ranks: ``fullgraph train`` and a script both print one line,
    the same but for the label, and exit 2 (a script 1); neither a traceback."""
    env = _as_rank(0, 2)
    cmd = [
        sys.executable,
        "-m",
        "fullgraph.cli",
        "train",
        "--parts",
        str(small_partitions[2]),
        "--transport",
        "local",
        "--epochs",
        "1",
    ]
    cli = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    script = [sys.executable, "-c", SCRIPT, "local"]
    pyg = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300, check=False)
    want = "error: transport local runs one rank, but the launcher started 2"
    assert _errors(cli) == [f"fullgraph train: {want}"], cli.stderr
    assert _errors(pyg) == [f"fullgraph.pyg: {want}"], pyg.stderr
    assert (cli.returncode, pyg.returncode) == (2, 1)
    assert "Traceback" not in cli.stderr + pyg.stderr, pyg.stderr


def test_a_scripts_unknown_transport_is_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, "carrier-pigeon"],
        env=_as_rank(0, 1),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1
    assert _errors(proc) == [
        "fullgraph.pyg: error: unknown transport 'carrier-pigeon' (choose from local, mpi, "
        "gloo, nccl)"
    ], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
