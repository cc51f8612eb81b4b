"""``fullgraph data ingest``: OGB layout in, npy layout out, then ``data info``, ``partition``
and ``verify`` on the output; one-line refusals that leave nothing."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from cli_run import assert_one_line, run_cli

from fullgraph.commands import data_ingest
from fullgraph.datasets import load
from fullgraph.datasets.ogb import read_ogb
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.partition import load_partition


def _ingest(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    return run_cli(["data", "ingest", "--dataset", "g", *extra], capsys)


def test_ingest_then_partition_and_verify(tmp_path: Path, capsys) -> None:
    src, out = tmp_path / "shared", tmp_path / "mine"
    write_ogb(generate("tiny", seed=2), src, "g")
    code, stdout, err = _ingest(
        capsys, "--root", str(src), "--out-root", str(out), "--feature-dtype", "float16"
    )
    assert code == 0, err
    assert f"wrote {out / 'g_npy'}" in stdout
    assert sorted(os.listdir(src)) == ["g"]  # nothing written beside the source
    code, stdout, _ = run_cli(["data", "info", "--dataset", "g-npy", "--root", str(out)], capsys)
    assert code == 0 and "nodes        3,000" in stdout, stdout
    parts = tmp_path / "parts"
    argv = ["partition", "--dataset", "g-npy", "--root", str(out), "--parts", "2"]
    code, stdout, err = run_cli([*argv, "--out", str(parts)], capsys)
    assert code == 0, err
    code, stdout, _ = run_cli(["verify", str(parts), "--root", str(out)], capsys)
    assert code == 0 and stdout.startswith("OK"), stdout
    want = read_ogb(src, "g", cache=False)
    for rank in range(2):
        part = load_partition(parts, rank)
        inner = np.asarray(part.global_ids[: part.num_inner])
        np.testing.assert_array_equal(part.x, want.x[inner].astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(part.y, want.y[inner])


def test_name_and_force(tmp_path: Path, capsys) -> None:
    write_ogb(generate("tiny", seed=2), tmp_path, "g")
    assert _ingest(capsys, "--root", str(tmp_path), "--name", "h")[0] == 0
    assert load("h", tmp_path).num_nodes == 3000
    code, _, err = _ingest(capsys, "--root", str(tmp_path), "--name", "h")
    assert code != 0 and "--force" in err, err
    assert _ingest(capsys, "--root", str(tmp_path), "--name", "h", "--force")[0] == 0


def test_read_only_root_needs_an_out_root(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_ogb(generate("tiny", seed=2), tmp_path, "g")
    access = os.access
    monkeypatch.setattr(
        data_ingest.os, "access", lambda p, mode: Path(p) != tmp_path and access(p, mode)
    )
    code, _, err = _ingest(capsys, "--root", str(tmp_path))
    assert_one_line(code, err, "cannot be written", "--out-root")
    assert sorted(os.listdir(tmp_path)) == ["g"]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--dataset", "g", "--out-root", "{root}/g"], ["is inside the dataset directory"]),
        (["--dataset", "g", "--name", "../x"], ["not a path"]),
        (["--dataset", "nope"], ["dataset 'nope' not found"]),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, capsys, argv: list[str], needles: list[str]) -> None:
    write_ogb(generate("tiny", seed=2), tmp_path, "g")
    argv = ["data", "ingest", "--root", str(tmp_path), *(a.format(root=tmp_path) for a in argv)]
    code, _, err = run_cli(argv, capsys)
    assert_one_line(code, err, *needles)
    assert sorted(os.listdir(tmp_path)) == ["g"]
    assert sorted(os.listdir(tmp_path / "g")) == ["meta.json", "raw", "split"]


def test_too_large_for_this_machine_is_refused(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_ogb(generate("tiny", seed=2), tmp_path, "g")
    monkeypatch.setattr("fullgraph.resources.node_memory_bytes", lambda: 1 << 20)
    code, _, err = _ingest(capsys, "--root", str(tmp_path))
    assert_one_line(code, err, "ingesting 3,000 nodes takes about", "GiB")
    assert sorted(os.listdir(tmp_path)) == ["g"]
