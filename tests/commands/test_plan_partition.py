"""``fullgraph plan partition`` prints the stages and whether they fit; ``fullgraph partition``
refuses a run its plan says will not fit (one line, nothing written), warns under ``warn``."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import assert_one_line, run_cli

import fullgraph.resources as resources


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fullgraph.datasets.synthetic import generate, write_ogb

    out = tmp_path_factory.mktemp("plan-partition")
    write_ogb(generate("tiny"), out, "tiny")
    return out


def test_the_plan_prints_every_stage(root, capsys) -> None:
    code, out, err = run_cli(
        ["plan", "partition", "--dataset", "tiny", "--root", str(root), "--parts", "2"], capsys
    )
    assert code == 0, err
    for needle in ("process floor", "assign", "build parts", "peak", "fits", "metis ("):
        assert needle in out, needle
    code, out, err = run_cli(
        [
            "plan",
            "partition",
            "--dataset",
            "tiny",
            "--root",
            str(root),
            "--parts",
            "2",
            "--node-memory",
            "0.01",
        ],
        capsys,
    )
    assert_one_line(code, err, "memory plan: the partition would need", "--method kaminpar")


def test_partition_refuses_what_will_not_fit(root, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(resources, "node_memory_bytes", lambda: 10 << 20)
    base = ["partition", "--dataset", "tiny", "--root", str(root), "--parts", "2"]
    code, _, err = run_cli([*base, "--out", str(tmp_path / "a")], capsys)
    assert_one_line(code, err, "would need", "more than this machine's", "--memory-check warn")
    assert not (tmp_path / "a").exists()
    code, _, err = run_cli([*base, "--out", str(tmp_path / "b"), "--memory-check", "warn"], capsys)
    assert code == 0 and "warning: memory plan: partitioning tiny" in err, err
    assert (tmp_path / "b" / "meta.json").exists()
