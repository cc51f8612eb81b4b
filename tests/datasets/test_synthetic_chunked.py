"""The chunked synthetic writer: the in-memory generator's graph, float16 features through
load and partition, atomic writes, one-line refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_run import assert_one_line, run_cli
from mp_utils import wait_until

import fullgraph.datasets.synthetic_edges as synthetic_edges
from fullgraph.datasets import load, synthetic_chunked
from fullgraph.datasets.synthetic import generate
from fullgraph.datasets.synthetic_chunked import write_synthetic
from fullgraph.partition import load_partition

ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")
SCALE = 1 / 20000


@pytest.mark.parametrize(("preset", "scale"), [("tiny", 1.0), ("papers", SCALE)])
def test_chunked_equals_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str, scale: float
) -> None:
    """Many small buckets, surplus blocks and row ranges: drops fall across bucket
    boundaries, keys feed several ranges."""
    monkeypatch.setattr(synthetic_chunked, "BUCKET_KEYS", 1 << 11)
    monkeypatch.setattr(synthetic_chunked, "RELEASE_BYTES", 1 << 16)
    monkeypatch.setattr(synthetic_chunked, "ROW_BUFFER", 1 << 12)  # many row ranges
    monkeypatch.setattr(synthetic_edges, "SURPLUS_BLOCK", 1 << 10)
    want = generate(preset, seed=3, scale=scale)
    path = write_synthetic(preset, tmp_path, "g", seed=3, scale=scale)
    assert sorted(p.name for p in path.iterdir()) == ["arrays", "meta.json"]  # no scratch
    got = load("g", tmp_path, mmap=True)
    for a in ARRAYS:
        np.testing.assert_array_equal(getattr(got, a), getattr(want, a), err_msg=a)
    assert got.num_classes == want.num_classes and got.meta["source"] == want.meta


def test_float16_features_through_load_and_partition(tmp_path: Path, capsys) -> None:
    root = tmp_path / "data"
    code, out, _ = run_cli(
        ["data", "synth", "--preset", "papers", "--scale", str(SCALE), "--format", "npy",
         "--feature-dtype", "float16", "--name", "p16", "--root", str(root)], capsys
    )  # fmt: skip
    assert code == 0, out
    exact = generate("papers", seed=0, scale=SCALE).x
    mapped = load("p16", root, mmap=True)
    assert mapped.x.dtype == np.float16  # as on disk: half the bytes
    np.testing.assert_array_equal(mapped.x, exact.astype(np.float16))
    read = load("p16", root)
    assert read.x.dtype == np.float32  # widened
    np.testing.assert_array_equal(read.x, exact.astype(np.float16).astype(np.float32))
    parts = tmp_path / "parts"
    argv = ["partition", "--dataset", "p16", "--root", str(root), "--parts", "2"]
    code, out, _ = run_cli([*argv, "--out", str(parts)], capsys)
    assert code == 0, out
    code, out, _ = run_cli(["verify", str(parts), "--root", str(root)], capsys)
    assert code == 0 and out.startswith("OK"), out
    for rank in range(2):
        part = load_partition(parts, rank)
        assert part.x.dtype == np.float32
        inner = np.asarray(part.global_ids[: part.num_inner])
        np.testing.assert_array_equal(part.x, read.x[inner])


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(*args: object) -> None:
        raise KeyboardInterrupt  # what SIGINT, and SIGTERM through the CLI, raise

    monkeypatch.setattr(synthetic_chunked, "_write_features", stop)
    with pytest.raises(KeyboardInterrupt):
        write_synthetic("tiny", tmp_path, "t")
    assert os.listdir(tmp_path) == []  # no dataset, no temporary directory


@pytest.mark.timeout(120)
def test_sigterm_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM while the edges are drawn: the CLI's clean-ups remove the temporary directory."""
    cmd = [sys.executable, "-m", "fullgraph.cli", "data", "synth", "--preset", "papers"]
    cmd += ["--scale", "0.01", "--format", "npy", "--name", "p", "--root", str(tmp_path)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)

    def drawing() -> bool:
        return any(p.stat().st_size for p in tmp_path.glob(".p.tmp-*/scratch/bucket-*"))

    wait_until(lambda: drawing() or proc.poll() is not None, 90, "edges being drawn")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert os.listdir(tmp_path) == []


def test_force_replaces_only_a_synth_dataset(tmp_path: Path, capsys) -> None:
    argv = ["data", "synth", "--preset", "tiny", "--format", "npy", "--root", str(tmp_path)]
    assert run_cli([*argv, "--name", "t"], capsys)[0] == 0
    assert run_cli([*argv, "--name", "t", "--seed", "1", "--force"], capsys)[0] == 0
    assert load("t", tmp_path).meta["source"]["seed"] == 1
    mine = tmp_path / "mine"
    (mine / "arrays").mkdir(parents=True)
    (mine / "arrays" / "notes.txt").write_text("mine")
    code, _, err = run_cli([*argv, "--name", "mine", "--force"], capsys)
    assert_one_line(code, err, "is not a dataset written by fullgraph")
    assert (mine / "arrays" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--feature-dtype", "float16"], "--feature-dtype float16 needs --format npy"),
        (["--format", "npy", "--edge-dim", "2"], "--format npy writes no edge values"),
        (["--format", "npy", "--scale", "0"], "--scale must be in (0, 1]"),
        (["--preset", "collab", "--format", "npy", "--scale", "0.01"], "node presets"),
        (["--preset", "papers"], "use --format npy (chunked) or a smaller --scale"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, extra: list[str], needle: str
) -> None:
    monkeypatch.setattr("fullgraph.resources.node_memory_bytes", lambda: 8 << 30)
    argv = ["data", "synth", "--preset", "tiny", "--name", "t", "--root", str(tmp_path)]
    code, _, err = run_cli([*argv, *extra], capsys)
    assert_one_line(code, err, needle)
    assert not (tmp_path / "t").exists()


def test_truncated_array_is_one_line(tmp_path: Path, capsys) -> None:
    path = write_synthetic("tiny", tmp_path, "t")
    x = path / "arrays" / "x.npy"
    x.write_bytes(x.read_bytes()[:1000])
    code, _, err = run_cli(["data", "info", "--dataset", "t", "--root", str(tmp_path)], capsys)
    assert_one_line(code, err, "x.npy")
