"""Mini-batch training across processes: P=2 gradients equal P=1, the CLI, and Cora accuracy.

Enters through :mod:`fullgraph.minibatch.trainer`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import minibatch_worker
import numpy as np
import pytest
from harness import assert_matches_one_process, run_task
from mp_utils import run_mpi

from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("minibatch-data")
    write_ogb(generate("tiny", seed=1), root, "synth-tiny")
    return root


def run(cmd: list[str], timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fullgraph.cli", "minibatch", *args]


@pytest.fixture(scope="module")
def one_rank_gradient(tiny_root, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    out = tmp_path_factory.mktemp("minibatch-p1") / "p1.npy"
    return run_task(
        minibatch_worker.gradient,
        ranks=None,
        out=out,
        timeout=150,
        root=tiny_root,
        transport="local",
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["mpi", "gloo"])
def test_two_ranks_give_the_first_step_gradient_of_one(
    tiny_root, one_rank_gradient, tmp_path, transport
) -> None:
    g2 = run_task(
        minibatch_worker.gradient,
        ranks=2,
        out=tmp_path / "p2.npy",
        timeout=200,
        root=tiny_root,
        transport=transport,
    )
    g1 = one_rank_gradient
    assert np.abs(g1[:-1]).max() > 0
    where = f"P=2, {transport}"
    assert_matches_one_process(g2, g1, {"step-1 gradient": (1e-5, 1e-7)}, where=where)


@pytest.mark.timeout(240)
def test_two_ranks_infer_the_logits_of_one(tiny_root, tmp_path) -> None:
    # Each rank holds its rows of every layer; the rows travel in broadcast chunks of 37.
    got = run_task(
        minibatch_worker.inference,
        ranks=2,
        out=tmp_path / "logits.npz",
        timeout=200,
        root=tiny_root,
        transport="mpi",
    )
    rows = np.concatenate([got[f"rank/{r}"] for r in range(2)])
    assert_matches_one_process(rows, got["whole"], {"logits": (1e-5, 1e-6)}, where="P=2, mpi")


@pytest.mark.timeout(240)
def test_cli_two_ranks_writes_the_train_fields(tiny_root, tmp_path) -> None:
    log = tmp_path / "log.jsonl"
    args = ["--dataset", "synth-tiny", "--root", str(tiny_root), "--fanouts", "5,5"]
    args += ["--batch-size", "256", "--hidden", "32", "--epochs", "2", "--lr", "0.01"]
    r = run_mpi(2, cli(*args, "--log-json", str(log), "--threads", "1")[1:], 200)
    assert r.stdout.count("epoch ") >= 2 and "final: best val" in r.stdout
    lines = [json.loads(s) for s in log.read_text().splitlines()]
    assert [rec["epoch"] for rec in lines[:-1]] == [1, 2]
    for rec in lines[:-1]:
        for key in ("loss", "train_acc", "val_acc", "test_acc", "epoch_s", "compute_s"):
            assert isinstance(rec[key], float), key
        assert rec["comm_bytes"] > 0 and rec["peak_rss_mb"] > 0 and rec["sampled_edges"] > 0
    final = lines[-1]
    assert final["final"] and final["ranks"] == 2 and final["transport"] == "mpi"
    assert final["test_acc"] > 0.3 and final["median_epoch_s"] > 0
    resolved = json.loads((tmp_path / "log.config.json").read_text())
    assert resolved["config"]["fanouts"] == [5, 5] and resolved["ranks"] == 2


@pytest.mark.timeout(120)
def test_cli_rejects_bad_input_with_one_line(tiny_root) -> None:
    r = run(cli("--dataset", "synth-tiny", "--root", str(tiny_root), "--fanouts", "5,x"))
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == "fullgraph minibatch: error: --fanouts must be comma-separated integers, got '5,x'"
    )
    r = run(cli("--dataset", "synth-tiny", "--root", str(tiny_root), "--fanouts", "5,0"))
    assert r.returncode == 2 and "positive counts" in r.stderr
    r = run(cli("--dataset", "nope", "--root", str(tiny_root)))
    assert r.returncode == 2 and "unknown dataset 'nope'" in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cora_reaches_78_percent(tmp_path, shared_dataset) -> None:
    log = tmp_path / "cora.jsonl"
    args = ["--dataset", "cora", "--root", str(shared_dataset("cora")), "--fanouts", "10,10"]
    args += ["--batch-size", "32", "--hidden", "64", "--lr", "0.01", "--weight-decay", "5e-4"]
    r = run(cli(*args, "--epochs", "8", "--dropout", "0.5", "--log-json", str(log), "--quiet"))
    assert r.returncode == 0, r.stderr
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["test_acc"] >= 0.78, final
