"""A failed allocation ends a run with one line (exit 1), in one process and on every rank.

Enters through :mod:`fullgraph.errors`.
"""

from __future__ import annotations

import argparse

import pytest

from fullgraph import cli
from fullgraph.errors import OutOfMemory, out_of_memory

TORCH_OOM = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 1280000000 bytes. Error code 12 (Cannot allocate memory)"
)


@pytest.mark.parametrize(
    "exc",
    [MemoryError(), RuntimeError(TORCH_OOM), RuntimeError("CUDA out of memory. Tried to allocate")],
)
def test_failed_allocations_become_one_line(exc: BaseException) -> None:
    oom = out_of_memory(exc, "train")
    assert isinstance(oom, OutOfMemory) and oom.exit_code == 1
    assert str(oom).startswith("out of memory: ") and "\n" not in str(oom)
    assert "fullgraph plan" in str(oom)


@pytest.mark.parametrize(
    ("command", "levers", "foreign"),
    [
        ("data synth", "--edge-dim", "--memory-check"),
        ("data info", "run it where more memory is free", "ranks"),
        ("partition", "whole graph in one process", "--memory-check"),
        ("minibatch", "--batch-size", "fullgraph plan"),
        ("", "free memory", "--memory-check"),
    ],
)
def test_each_command_is_given_its_own_levers(command: str, levers: str, foreign: str) -> None:
    """A command is never told of another command's options (issue 31: `data synth` was given
    train's ranks and --memory-check)."""
    text = str(out_of_memory(MemoryError("Unable to allocate 10.9 TiB"), command))
    assert levers in text and foreign not in text


@pytest.mark.parametrize("exc", [RuntimeError("shapes do not match"), ValueError("x")])
def test_other_errors_are_left_alone(exc: BaseException) -> None:
    assert out_of_memory(exc) is None


def test_the_command_line_prints_one_line_and_exits_1(monkeypatch, capsys) -> None:
    def fails(args: argparse.Namespace) -> int:
        raise RuntimeError(TORCH_OOM)

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=fails)
    monkeypatch.setattr(cli, "build_parser", lambda argv: parser)
    assert cli.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fullgraph: error: out of memory: "), err


def test_other_runtime_errors_still_raise(monkeypatch) -> None:
    def fails(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=fails)
    monkeypatch.setattr(cli, "build_parser", lambda argv: parser)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main([])
