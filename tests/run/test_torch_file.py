"""The values a saved state may hold (:func:`fullgraph.run.torch_file.check_values`): the
model's names, dtypes and shapes, and no NaN or infinity; one line naming the file and the
tensor."""

from __future__ import annotations

import pytest
import torch

from fullgraph.errors import ConfigError
from fullgraph.run.torch_file import check_values, named_values, value_problem

EXPECTED = {"w": torch.zeros(2, 3), "b": torch.zeros(3), "n": torch.tensor(0)}


def _state(**changes: torch.Tensor) -> dict[str, torch.Tensor]:
    return {**{k: v.clone() for k, v in EXPECTED.items()}, **changes}


def test_a_state_like_the_models_passes() -> None:
    check_values(_state(), EXPECTED, where="m.pt")  # int buffers are not checked for NaN
    check_values(named_values({"lr": 0.01, "avg": [torch.ones(2)]}), where="ck.pt")


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"w": torch.tensor([[1.0, float("nan"), 2.0], [0.0, 0.0, 0.0]])}, "'w' has 1 NaN (of 6"),
        ({"b": torch.tensor([float("inf"), -float("inf"), float("nan")])}, "1 NaN and 2 inf"),
        ({"w": torch.zeros(2, 3, dtype=torch.int64)}, "'w' is int64, expected float32"),
        ({"w": torch.zeros(2, 3, dtype=torch.float64)}, "'w' is float64, expected float32"),
        ({"b": torch.zeros(4)}, "'b' has shape (4,), expected (3,)"),
        ({"extra": torch.zeros(1)}, "'extra' is not in the model"),
    ],
)
def test_a_bad_value_is_one_line_naming_file_and_tensor(changes, needle) -> None:
    with pytest.raises(ConfigError) as info:
        check_values(_state(**changes), EXPECTED, where="model.pt", remedy="retrain")
    message = str(info.value)
    assert message.startswith("model.pt: parameter ") and needle in message, message
    assert message.endswith("; retrain") and "\n" not in message


def test_a_missing_tensor_and_a_bad_float_are_named() -> None:
    state = _state()
    del state["b"]
    with pytest.raises(ConfigError, match="'b' is missing"):
        check_values(state, EXPECTED, where="m.pt")
    saved = named_values({"lr": float("nan"), "exp_avg": [torch.ones(1)]})
    with pytest.raises(ConfigError, match="ck.pt: optimiser state 'lr' is nan"):
        check_values(saved, where="ck.pt", what="optimiser state")
    assert value_problem([1.0], torch.zeros(1)) == "is a list, expected a torch.float32 tensor"


def test_named_values_walks_dicts_and_lists() -> None:
    t = torch.ones(1)
    found = named_values({"exp_avg": [t, t], "betas": [0.9, 0.99], "name": "x", "n": 3})
    assert list(found) == ["exp_avg.0", "exp_avg.1", "betas.0", "betas.1"]
