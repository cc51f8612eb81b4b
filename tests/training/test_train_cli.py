"""``fullgraph train`` end to end: JSONL log, checkpoints and resume, and the faults.

- rank count != part count: an error before any collective;
- a rank that raises mid-epoch (``FULLGRAPH_FAIL_AT=rank:epoch``): the job exits non-zero
  within 60 s with that rank's error, no hang;
- a corrupted part file: a clear error naming it;
- ``--resume`` after that failure reproduces the uninterrupted run's losses exactly.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from mp_utils import one_thread, run_mpi

from fullgraph.cli import main as cli_main

TRAIN = ["-m", "fullgraph.cli", "train"]
FIELDS = {"epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_s", "compute_s", "comm_s"}
FIELDS |= {"comm_bytes", "peak_rss_mb"}


def _losses(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["epoch"]: r["loss"] for r in rows if not r.get("final")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fault_then_resume_matches_uninterrupted(small_partitions, tmp_path: Path) -> None:
    parts = str(small_partitions[2])
    common = [*TRAIN, "--parts", parts, "--model", "sage", "--epochs", "8", "--quiet"]
    full_log = tmp_path / "full.jsonl"
    run_mpi(2, [*common, "--log-json", str(full_log)])
    rows = [json.loads(line) for line in full_log.read_text().splitlines()]
    assert len(rows) == 9 and rows[-1]["final"] is True
    assert FIELDS <= set(rows[0]), f"missing fields: {FIELDS - set(rows[0])}"
    assert {"best_val_acc", "test_acc", "median_epoch_s"} <= set(rows[-1])
    assert all(r["comm_bytes"] > 0 for r in rows[:-1])
    assert (tmp_path / "full.config.json").is_file()

    ckpt, log = tmp_path / "ckpt", tmp_path / "resumed.jsonl"
    t0 = time.monotonic()
    failed = run_mpi(
        2,
        [*common, "--checkpoint", str(ckpt), "--checkpoint-every", "2", "--log-json", str(log)],
        timeout=90,
        expect_ok=False,
        env={"FULLGRAPH_FAIL_AT": "1:6"},
    )
    assert failed.returncode != 0
    assert time.monotonic() - t0 < 60
    assert "rank 1" in failed.stderr and "injected failure" in failed.stderr, failed.stderr
    assert (ckpt / "checkpoint.pt").is_file() and (ckpt / "config.json").is_file()

    run_mpi(2, [*common, "--checkpoint", str(ckpt), "--resume", "--log-json", str(log)])
    full, resumed = _losses(full_log), _losses(log)
    epochs = [json.loads(line).get("epoch") for line in log.read_text().splitlines()]
    assert epochs == [*range(1, 9), None]  # epoch 5 logged once; the final object last
    for epoch in range(5, 9):
        assert resumed[epoch] == pytest.approx(full[epoch], rel=1e-7, abs=0), epoch


@pytest.mark.timeout(120)
def test_rank_count_must_equal_part_count(small_partitions) -> None:
    proc = run_mpi(2, [*TRAIN, "--parts", str(small_partitions[4])], 60, expect_ok=False)
    assert proc.returncode != 0
    assert "has 4 parts but 2 ranks" in proc.stderr, proc.stderr


@pytest.mark.timeout(120)
def test_corrupted_part_names_the_file(small_partitions, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    shutil.copytree(small_partitions[2], parts)
    target = parts / "part-1" / "x.npy"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0xFF
    target.write_bytes(bytes(data))
    proc = run_mpi(2, [*TRAIN, "--parts", str(parts), "--epochs", "2"], 60, expect_ok=False)
    assert proc.returncode != 0
    assert "part-1/x.npy" in proc.stderr and "rank 1" in proc.stderr, proc.stderr


def test_one_process_cli_and_bad_options(small_graph, tmp_path: Path, capsys) -> None:
    with one_thread():
        assert cli_main(["train", "--synthetic", "tiny", "--epochs", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "epoch    3" in out and "final: best val" in out
    assert cli_main(["train", "--synthetic", "tiny", "--layers", "0"]) == 2
    assert "--layers must be an integer >= 1, got 0" in capsys.readouterr().err
    assert cli_main(["train", "--epochs", "3"]) == 2
    assert "exactly one of --parts" in capsys.readouterr().err
    assert cli_main(["train", "--synthetic", "tiny", "--resume"]) == 2
    assert "--resume needs --checkpoint" in capsys.readouterr().err
    assert cli_main(["train", "--synthetic", "tiny", "--exchange-buffer-mb", "0"]) == 2
    assert "--exchange-buffer-mb must be a finite number > 0" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli_main(["train", "--synthetic", "tiny", "--device", "cuda"]) == 2
        assert "sees no CUDA device" in capsys.readouterr().err
