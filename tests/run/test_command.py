"""The scaffold every command runs in (:class:`fullgraph.run.command.Command`): its steps in
order, one process. Process defaults first; the options read, the transport and device
resolved, then the command's checks, all before the threads are set and the communicator
exists; then the :class:`~fullgraph.run.command.Job`, the work, and the job closed, as failed
when the work raised."""

from __future__ import annotations

import argparse

import pytest
import torch

import fullgraph.distributed
import fullgraph.resources
from fullgraph.errors import ConfigError
from fullgraph.run import command


@pytest.fixture
def steps(monkeypatch) -> list:
    """The steps the scaffold takes, recorded where it calls out (the threads are not set)."""
    seen: list = []
    monkeypatch.setattr(fullgraph.resources, "process_defaults", lambda: seen.append("defaults"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(("threads", n)))
    connect = fullgraph.distributed.create_communicator

    def create_communicator(transport: str, *args, **kwargs):
        seen.append(("communicator", transport))
        return connect(transport, *args, **kwargs)

    monkeypatch.setattr(fullgraph.distributed, "create_communicator", create_communicator)

    class Job(command.Job):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            seen.append("job")

        def close(self, failed: bool = False) -> None:
            seen.append(("close", failed))
            super().close(failed)

    monkeypatch.setattr(command, "Job", Job)
    return seen


class Probe(command.Command):
    """A command that records its own steps; ``fail`` names the one that raises."""

    name = "probe"

    def __init__(self, args: argparse.Namespace, seen: list, fail: str = "") -> None:
        super().__init__(args)
        self.seen, self.fail = seen, fail

    def configure(self) -> None:
        self.seen.append("configure")
        super().configure()

    def check(self) -> None:
        self.seen.append(("check", self.transport, self.device))
        if self.fail == "check":
            raise ConfigError("probe: bad option")

    def run(self, job: command.Job) -> str:
        self.seen.append(("run", job.comm.size))
        if self.fail == "run":
            raise RuntimeError("probe failed")
        return "done"


def test_the_steps_run_in_order(steps: list) -> None:
    probe = Probe(argparse.Namespace(threads=3, quiet=True), steps)
    assert probe.execute() == "done"
    assert steps == [
        "defaults",
        "configure",
        ("check", "local", "cpu"),  # the transport and device resolved before the checks
        ("threads", 3),
        ("communicator", "local"),
        "job",
        ("run", 1),
        ("close", False),
    ]


def test_a_failed_check_sets_no_threads_and_starts_no_communicator(steps: list) -> None:
    with pytest.raises(ConfigError, match="probe: bad option"):
        Probe(argparse.Namespace(threads=3, quiet=True), steps, fail="check").execute()
    assert steps == ["defaults", "configure", ("check", "local", "cpu")]


def test_a_failed_run_closes_its_job_as_failed(steps: list) -> None:
    with pytest.raises(RuntimeError, match="probe failed"):
        Probe(argparse.Namespace(threads=3, quiet=True), steps, fail="run").execute()
    assert steps[-2:] == [("run", 1), ("close", True)]
    assert steps.count(("close", True)) == 1 and ("close", False) not in steps
