"""The model file ``fullgraph train`` writes, and checkpoints, open with plain ``torch.load``.

The best-validation model goes to ``--save-model`` (default ``<log stem>.model.pt``): weights,
normalisation statistics and the model's config, checksummed in the zip archive's comment; it
rebuilds the model whose evaluation gave the recorded validation score. Its path obeys the
rules of every output (no replacing without ``--force``, never a file fullgraph did not write,
never inside an input).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_run import assert_one_line, run_cli
from file_tree import tree

from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.partition import whole_graph_part
from fullgraph.run.torch_file import encode_torch_file, read_torch_file
from fullgraph.training.assembly import assemble_rank
from fullgraph.training.model_file import load_model_file

TRAIN = ["train", "--threads", "1", "--quiet", "--synthetic", "tiny", "--model", "sage"]


def test_the_best_model_is_written_and_opens_with_torch_load(tmp_path: Path, capsys) -> None:
    log, ck = tmp_path / "run.jsonl", tmp_path / "ck"
    args = [*TRAIN, "--norm", "batch", "--epochs", "12", "--log-json", str(log)]
    code, _, err = run_cli([*args, "--checkpoint", str(ck), "--checkpoint-every", "5"], capsys)
    assert code == 0, err
    final = json.loads(log.read_text().splitlines()[-1])
    state = torch.load(tmp_path / "run.model.pt", weights_only=True)  # no fullgraph reader
    assert state["format"] == "fullgraph-model" and state["epoch"] == final["best_epoch"]
    assert state["val"] == final["best_val_acc"] and state["config"]["model"] == "sage"
    assert "norms.0.running_mean" in state["state_dict"]  # BatchNorm statistics kept
    assert torch.load(ck / "checkpoint.pt", weights_only=True)["epoch"] == 12
    # the file rebuilds the model whose evaluation gave the best validation accuracy
    from fullgraph.datasets.synthetic import generate

    mf = load_model_file(tmp_path / "run.model.pt")
    part = whole_graph_part(generate("tiny", seed=mf.config.seed))
    rank = assemble_rank(part, Communicator(), mf.config)
    with torch.no_grad():
        pred = mf.build()(rank.data["x"], rank.ctx).argmax(dim=1)
    val = rank.data["val"]
    acc = float((pred[val] == rank.data["y"][val]).double().mean())
    assert acc == pytest.approx(final["best_val_acc"], abs=1e-12)


def test_save_model_path_obeys_the_output_rules(tmp_path: Path, capsys) -> None:
    model = tmp_path / "m.pt"
    code, _, err = run_cli([*TRAIN, "--epochs", "2", "--save-model", str(model)], capsys)
    assert code == 0, err and model.is_file()
    before = tree(tmp_path)
    code, _, err = run_cli([*TRAIN, "--epochs", "2", "--save-model", str(model)], capsys)
    assert code == 2 and "already exists" in err and tree(tmp_path) == before, err
    code, _, err = run_cli([*TRAIN, "--epochs", "2", "--save-model", str(model), "--force"], capsys)
    assert code == 0, err
    mine = tmp_path / "notes.pt"
    mine.write_bytes(b"a user's own file")
    before = tree(tmp_path)
    code, _, err = run_cli([*TRAIN, "--epochs", "2", "--save-model", str(mine), "--force"], capsys)
    assert_one_line(code, err, "is not a model file written by fullgraph")
    assert tree(tmp_path) == before


def test_a_model_inside_the_partition_is_refused(small_partitions, capsys) -> None:
    parts = small_partitions[1]
    before = tree(parts)
    code, _, err = run_cli(
        ["train", "--parts", str(parts), "--quiet", "--save-model", f"{parts}/m.pt"], capsys
    )
    assert_one_line(code, err, "is inside the partition this command reads")
    assert tree(parts) == before


def test_model_files_that_are_not_one_are_refused(tmp_path: Path) -> None:
    ck = tmp_path / "ck.pt"
    ck.write_bytes(encode_torch_file({"model": {}, "optimizer": {}, "epoch": 1}))
    with pytest.raises(ConfigError, match="is a checkpoint, not a model file"):
        load_model_file(ck)
    good = tmp_path / "good.pt"
    good.write_bytes(encode_torch_file({"format": "fullgraph-model", "version": 1}))
    data = good.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="not a fullgraph model file"):
        load_model_file(cut)
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 1
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ConfigError, match="fails its sha256 checksum"):
        read_torch_file(bad)
    with pytest.raises(ConfigError, match="holds no config"):
        load_model_file(good)


def _model_file(path: Path, **changes: torch.Tensor) -> Path:
    """A model file of an untrained 2-layer GCN (8 features, 3 classes), tensors replaced."""
    from fullgraph.training.config import TrainConfig
    from fullgraph.training.model_file import model_state, save_model_file

    config = TrainConfig(model="gcn", hidden=4)
    state = model_state(config.build_model(8, 3), config, 8, 3, {"epoch": 1})
    state["state_dict"].update(changes)
    return save_model_file(path, state)


@pytest.mark.parametrize(
    ("tensor", "needle"),
    [
        (torch.tensor([0.1, float("nan"), 0.2]), "'layers.1.lin.bias' has 1 NaN (of 3 values)"),
        (torch.tensor([float("inf"), 0.0, 0.0]), "'layers.1.lin.bias' has 1 inf"),
        (torch.tensor([1, 2, 3]), "'layers.1.lin.bias' is int64, expected float32"),
        (torch.zeros(4), "'layers.1.lin.bias' has shape (4,), expected (3,)"),
    ],
)
def test_a_model_file_with_bad_weights_is_refused_by_predict_and_export(
    tensor: torch.Tensor, needle: str, tmp_path: Path, capsys
) -> None:
    model = _model_file(tmp_path / "model.pt", **{"layers.1.lin.bias": tensor})
    with pytest.raises(ConfigError, match="model.pt: parameter ") as info:
        load_model_file(model)
    assert needle in str(info.value)
    code, _, err = run_cli(
        ["export", "--model", str(model), "--to", "pyg", str(tmp_path / "m.py")], capsys
    )
    assert_one_line(code, err, needle)
    out = tmp_path / "pred"
    code, _, err = run_cli(
        ["predict", "--synthetic", "tiny", "--model", str(model), "--out", str(out)], capsys
    )
    assert_one_line(code, err, needle)
    assert not out.exists() and not (tmp_path / "m.py").exists()
    assert load_model_file(_model_file(tmp_path / "good.pt")).num_classes == 3
