"""Correct & Smooth through the commands: ``fullgraph predict --correct-smooth`` end to end on a
tiny graph, the trainer's best model chosen by the smoothed validation metric, and the
one-line refusals of the command lines.

- predict: the model's logits (``--logits``) put through :class:`CorrectSmooth` in this process
  give the files ``--correct-smooth`` writes bit for bit (``probabilities.npy`` the smoothed
  scores, ``predictions.npy`` their argmax); ``predict.json`` holds the parameters, the smoothed
  summary and the model's own; at P = 2 (``--parts``, slow) the same files;
- training: every evaluated epoch logs the smoothed metrics and the model's own
  (``base_<split>_acc``); the best epoch is that of the best smoothed validation accuracy, on a
  run where the model's own best is another epoch (so the test can fail); the model file
  keeps that epoch and C&S's record;
- bad input: ``--logits`` with ``--correct-smooth``, alpha 0, an unknown scale, a parameter
  without ``--correct-smooth``: one line each, status 2.

Enters through :mod:`fullgraph.propagation.correct_smooth`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_run import assert_one_line, run_cli
from mp_utils import one_thread, run_mpi

from fullgraph.cli import main as cli_main
from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloPlan
from fullgraph.partition import partition_graph, whole_graph_part
from fullgraph.propagation.correct_smooth import CorrectSmooth, CorrectSmoothParams
from fullgraph.training import RunOptions, TrainConfig, Trainer
from fullgraph.training.model_file import load_model_file

CS = ["--correct-smooth", "--correction-layers", "8", "--smoothing-layers", "6"]
PARAMS = CorrectSmoothParams(8, 1.0, 6, 0.8, 20.0)


def _cli(argv: list[str]) -> None:
    with one_thread():
        assert cli_main([*argv, "--threads", "1"]) == 0


@pytest.fixture(scope="module")
def trained(small_graph, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``small_graph`` on disk and a GCN trained on it (5 epochs, one process)."""
    from fullgraph.datasets.synthetic import write_ogb

    root = tmp_path_factory.mktemp("cs-data")
    write_ogb(small_graph, root, small_graph.name)
    model = root / "gcn.pt"
    data = ["--dataset", small_graph.name, "--root", str(root)]
    _cli(["train", *data, "--epochs", "5", "--quiet", "--save-model", str(model)])
    return {"data": data, "model": model, "root": root}


def _smoothed_in_process(small_graph, logits: np.ndarray) -> torch.Tensor:
    """:class:`CorrectSmooth` of global-order ``logits`` on the whole graph, global order."""
    part = whole_graph_part(small_graph)
    cs = CorrectSmooth.of_part(part, HaloPlan.from_partition(part, Communicator()), PARAMS)
    gids = torch.from_numpy(np.asarray(part.global_ids[: part.num_inner], dtype=np.int64))
    scores = cs(torch.from_numpy(np.array(logits))[gids])
    out = torch.empty_like(scores)
    out[gids] = scores
    return out


def test_predict_writes_the_smoothed_predictions(small_graph, trained, tmp_path: Path) -> None:
    common = [*trained["data"], "--model", str(trained["model"]), "--quiet"]
    _cli(["predict", *common, "--logits", "--out", str(tmp_path / "raw")])
    _cli(["predict", *common, *CS, "--out", str(tmp_path / "cs")])
    logits = np.load(tmp_path / "raw" / "logits.npy")
    want = _smoothed_in_process(small_graph, logits)
    got = torch.from_numpy(np.load(tmp_path / "cs" / "probabilities.npy"))
    assert torch.equal(got, want)
    predictions = np.load(tmp_path / "cs" / "predictions.npy")
    assert np.array_equal(predictions, want.argmax(dim=1).numpy())
    assert not np.array_equal(predictions, logits.argmax(axis=1))  # C&S changed some
    record = json.loads((tmp_path / "cs" / "predict.json").read_text())
    cs = record["correct_smooth"]
    assert cs["correction_layers"] == 8 and cs["smoothing_layers"] == 6 and cs["scale"] == 20.0
    assert "Correct & Smooth's class scores" in cs["probabilities"]
    test = small_graph.test_mask
    acc = float((predictions[test] == small_graph.y[test]).mean())
    assert record["summary"]["test_acc"] == pytest.approx(acc, abs=1e-12)
    base = float((logits.argmax(axis=1)[test] == small_graph.y[test]).mean())
    assert cs["base_summary"]["test_acc"] == pytest.approx(base, abs=1e-12)
    assert "--correct-smooth" in record["command"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_predict_at_two_ranks_writes_what_one_process_writes(
    small_graph, trained, tmp_path: Path
) -> None:
    parts = tmp_path / "parts-2"
    partition_graph(small_graph, 2, parts, method="metis", seed=0)
    model = ["--model", str(trained["model"]), "--quiet", *CS]
    _cli(["predict", *trained["data"], *model, "--out", str(tmp_path / "one")])
    argv = ["-m", "fullgraph.cli", "predict", "--threads", "1", "--parts", str(parts), *model]
    run_mpi(2, [*argv, "--out", str(tmp_path / "two")], timeout=240)
    for name in ("probabilities.npy", "predictions.npy"):
        got, want = np.load(tmp_path / "two" / name), np.load(tmp_path / "one" / name)
        assert np.array_equal(got, want), name


def test_training_picks_the_best_smoothed_validation(small_graph, tmp_path: Path) -> None:
    model = tmp_path / "best.pt"
    cfg = TrainConfig(
        model="gcn",
        hidden=8,
        epochs=12,
        lr=0.02,
        seed=1,
        correct_smooth=True,
        correction_layers=8,
        smoothing_layers=6,
    )
    log = io.StringIO()
    with one_thread():
        tr = Trainer(
            whole_graph_part(small_graph),
            Communicator(),
            cfg,
            RunOptions(quiet=True, save_model=str(model)),
        )
        final = tr.fit(log)
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    epochs = [r for r in records if "val_acc" in r and "epoch" in r and not r.get("final")]
    assert len(epochs) == 12 and all("base_val_acc" in r for r in epochs)
    smoothed = [r["val_acc"] for r in epochs]
    base = [r["base_val_acc"] for r in epochs]
    best = int(np.argmax(smoothed)) + 1
    assert int(np.argmax(base)) + 1 != best, "the model's own best is the same epoch"
    assert final["best_epoch"] == best and final["best_val_acc"] == max(smoothed)
    assert final["test_acc"] == epochs[best - 1]["test_acc"]
    record = final["correct_smooth"]
    assert record["base_val_acc_at_best"] == base[best - 1]
    info = load_model_file(str(model)).info
    assert info["epoch"] == best and info["val"] == max(smoothed)
    assert info["correct_smooth"]["smoothing_layers"] == 6


def test_bad_command_lines_are_one_line(trained, capsys, tmp_path: Path) -> None:
    common = [*trained["data"], "--model", str(trained["model"]), "--out", str(tmp_path / "o")]
    code, _, err = run_cli(["predict", *common, "--correct-smooth", "--logits"], capsys)
    assert_one_line(code, err, "--logits", "--correct-smooth", "give one of them")
    train = ["train", "--synthetic", "tiny", "--epochs", "1", "--quiet"]
    code, _, err = run_cli([*train, "--correct-smooth", "--smoothing-alpha", "0"], capsys)
    assert_one_line(code, err, "--smoothing-alpha must be in (0, 1], not 0")
    code, _, err = run_cli([*train, "--correct-smooth", "--correction-scale", "x"], capsys)
    assert_one_line(code, err, "--correction-scale must be auto or a number > 0")
    code, _, err = run_cli([*train, "--correction-layers", "5"], capsys)
    assert_one_line(code, err, "--correction-layers applies to Correct & Smooth")
    code, _, err = run_cli(["predict", *common, "--smoothing-layers", "-2"], capsys)
    assert_one_line(code, err, "--smoothing-layers must be an integer >= 0")
