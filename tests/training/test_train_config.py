"""``TrainConfig``'s rules between fields and bounds: a warm-up that ends within the run, a
depth fullgraph trains; one line each, before any work.

Enters through :mod:`fullgraph.training.config`.
"""

from __future__ import annotations

import pytest

from fullgraph.errors import ConfigError
from fullgraph.training.config import MAX_LAYERS, TrainConfig


@pytest.mark.parametrize("warmup", [10, 11, 10**23])
def test_a_warmup_that_does_not_end_within_the_run_is_refused(warmup: int) -> None:
    with pytest.raises(ConfigError, match=f"--lr-warmup {warmup} must be below --epochs 10"):
        TrainConfig(epochs=10, lr_warmup=warmup)
    assert TrainConfig(epochs=10, lr_warmup=9).lr_warmup == 9


def test_a_depth_beyond_the_bound_is_refused_with_its_reason() -> None:
    with pytest.raises(ConfigError, match=f"--layers 100000 is beyond the {MAX_LAYERS} layers"):
        TrainConfig(layers=100_000)
    with pytest.raises(ConfigError, match="--layers must be an integer >= 1"):
        TrainConfig(layers=0)
    assert TrainConfig(layers=MAX_LAYERS).layers == MAX_LAYERS


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"decoder": "mlp"}, "--decoder applies to --task link"),
        ({"link_batch": 64}, "--link-batch applies to --task link"),
        ({"neg_ratio": 3}, "--neg-ratio applies to --task link"),
        ({"task": "link", "metric": "acc"}, "--metric acc scores node tasks"),
        ({"task": "link", "correct_smooth": True}, "has none to propagate"),
        ({"task": "link", "link_batch": -1}, "--link-batch"),
    ],
)
def test_link_options_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**settings)
    cfg = TrainConfig(task="link", decoder="mlp", link_batch=64, neg_ratio=3, embed_dim=8)
    assert cfg.build_model(5, 1).decoder.lins[0].in_features == 8
