"""``--resume`` refuses a checkpoint whose weights or optimiser state the model cannot take
(NaN, infinity, another dtype) in one line naming the file and the tensor, before any step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mp_utils import one_thread

from fullgraph.cli import main as cli_main
from fullgraph.run.torch_file import encode_torch_file, read_torch_file

TRAIN = ["train", "--threads", "1", "--quiet", "--synthetic", "tiny", "--epochs", "2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ck = tmp_path_factory.mktemp("trained") / "ck"
    with one_thread():
        assert cli_main([*TRAIN, "--checkpoint", str(ck), "--checkpoint-every", "1"]) == 0
    return ck / "checkpoint.pt"


def _set(state: dict, where: str, key: str, tensor: torch.Tensor) -> None:
    if where == "optimizer":
        index, name = key.split(".")
        state["optimizer"][index][int(name)] = tensor
    else:
        state["model"][key] = tensor


@pytest.mark.parametrize(
    ("where", "key", "value", "needle"),
    [
        ("optimizer", "exp_avg_sq.1", float("nan"), "optimiser state 'exp_avg_sq.1' has 1 NaN"),
        ("optimizer", "exp_avg.0", float("inf"), "optimiser state 'exp_avg.0' has 1 inf"),
        ("model", "layers.0.lin.weight", float("nan"), "parameter 'layers.0.lin.weight' has 1 NaN"),
        ("model", "layers.1.lin.bias", None, "'layers.1.lin.bias' is int64, expected float32"),
    ],
)
def test_resume_refuses_a_damaged_checkpoint(
    checkpoint: Path, where: str, key: str, value: float | None, needle: str, tmp_path, capsys
) -> None:
    state = read_torch_file(checkpoint)
    found = state[where][key] if where == "model" else state[where][key.split(".")[0]]
    tensor = found if where == "model" else found[int(key.split(".")[1])]
    tensor = tensor.to(torch.int64) if value is None else tensor.clone()
    if value is not None:
        tensor.view(-1)[0] = value
    _set(state, where, key, tensor)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "checkpoint.pt").write_bytes(encode_torch_file(state))
    before = (ck / "checkpoint.pt").read_bytes()
    with one_thread():
        code = cli_main([*TRAIN, "--epochs", "4", "--checkpoint", str(ck), "--resume"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert "checkpoint.pt: " in lines[0] and (ck / "checkpoint.pt").read_bytes() == before
