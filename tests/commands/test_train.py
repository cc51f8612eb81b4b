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
from fullgraph.commands.train import MODEL_NOT_KEPT

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
    # no --save-model, no --log-json: the last line says the model is not kept, and how to
    assert out.strip().splitlines()[-1] == MODEL_NOT_KEPT and "--save-model PATH" in MODEL_NOT_KEPT
    model = tmp_path / "m.pt"
    with one_thread():
        argv = ["train", "--synthetic", "tiny", "--epochs", "2", "--threads", "1"]
        assert cli_main([*argv, "--save-model", str(model)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("model (best validation, epoch ") and last.endswith(str(model))
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


def _metric_rows(path: Path, metric: str) -> list[tuple]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    keys = (f"val_{metric}", f"test_{metric}", f"best_val_{metric}", "metric")
    return [tuple(r.get(k) for k in keys) for r in rows]


@pytest.mark.timeout(180)
def test_rocauc_of_a_binary_graph_is_the_same_at_one_and_two_ranks(make_graph, tmp_path, capsys):
    """`auto` picks ROC-AUC for two classes; 2 ranks gather the scores and report, epoch by
    epoch and in the final record, what the whole graph in one process reports."""
    from fullgraph.datasets.ogb_writer import write_ogb

    root = tmp_path / "data"
    write_ogb(make_graph(num_classes=2, p_in=0.55, num_features=4, seed=1, name="bin"), root, "bin")
    common = ["--epochs", "6", "--threads", "1"]
    one = tmp_path / "one.jsonl"
    with one_thread():
        argv = ["train", "--dataset", "bin", "--root", str(root), *common, "--log-json", str(one)]
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert "| rocauc train" in out and "final: best val rocauc" in out
        parts = tmp_path / "parts"
        argv = ["partition", "--dataset", "bin", "--root", str(root), "--parts", "2", "--out"]
        assert cli_main([*argv, str(parts)]) == 0
    two = tmp_path / "two.jsonl"
    run_mpi(2, [*TRAIN, "--parts", str(parts), *common, "--quiet", "--log-json", str(two)])
    got, want = _metric_rows(two, "rocauc"), _metric_rows(one, "rocauc")
    assert got == want
    assert 0.5 < want[-1][2] < 1.0 and want[-1][3] == "rocauc"  # a score, not a trivial one
    assert all(r[0] is not None for r in want[:-1])
    assert json.loads((tmp_path / "two.config.json").read_text())["metric"] == "rocauc"
    info = torch.load(tmp_path / "two.model.pt", weights_only=False)  # names the metric
    final = json.loads(two.read_text().splitlines()[-1])
    assert (info["metric"], info["val"]) == ("rocauc", final["best_val_rocauc"])


@pytest.mark.timeout(120)
def test_metric_rocauc_of_seven_classes_is_refused_in_one_line(make_graph, tmp_path, capsys):
    from fullgraph.datasets.ogb_writer import write_ogb
    from fullgraph.partition import partition_graph

    graph = make_graph(num_classes=7, seed=2, name="seven")
    write_ogb(graph, tmp_path, "seven")
    line = "--metric rocauc needs a binary task, but seven has 7 classes"
    argv = ["train", "--dataset", "seven", "--root", str(tmp_path), "--metric", "rocauc"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert line in err and err.count("\n") == 1, err
    parts = tmp_path / "parts"
    partition_graph(graph, 2, parts)
    proc = run_mpi(2, [*TRAIN, "--parts", str(parts), "--metric", "rocauc"], 60, expect_ok=False)
    assert proc.returncode == 2 and proc.stderr.count(line) == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "epoch" not in proc.stdout, proc.stderr


def test_split_needs_a_dataset_with_fixed_splits(make_graph, tmp_path, capsys) -> None:
    from fullgraph.datasets.ogb_writer import write_ogb

    write_ogb(make_graph(name="plain"), tmp_path, "plain")
    argv = ["train", "--dataset", "plain", "--root", str(tmp_path), "--split", "1"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "--split: plain has no fixed splits" in err and err.count("\n") == 1, err
    assert cli_main(["train", "--synthetic", "tiny", "--split", "1"]) == 2
    assert "--split applies to --dataset" in capsys.readouterr().err
    assert cli_main(["train", "--dataset", "plain", "--root", str(tmp_path), "--split", "-1"]) == 2
    assert "--split must be an integer >= 0, got -1" in capsys.readouterr().err
