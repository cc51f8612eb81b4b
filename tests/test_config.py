"""Every float option of a :class:`~fullgraph.config.Config` refuses NaN and infinity, whether
or not its field has a check of its own."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fullgraph.config import Config, option
from fullgraph.errors import ConfigError
from fullgraph.training.config import TrainConfig


@dataclass
class _Options(Config):
    scale: float = option(1.0, "a float without a check")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_float_is_refused_without_a_check(value: float) -> None:
    with pytest.raises(ConfigError, match=f"--scale must be a finite number, got {value}"):
        _Options(scale=value)
    assert _Options(scale=2.5).scale == 2.5


@pytest.mark.parametrize("name", ["lr", "dropout", "weight_decay", "exchange_buffer_mb"])
def test_a_checked_float_keeps_its_own_message(name: str) -> None:
    with pytest.raises(ConfigError, match=f"--{name.replace('_', '-')} must be a finite number "):
        TrainConfig(**{name: float("nan")})
