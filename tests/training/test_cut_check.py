"""What a model may do on a receptive-field cut: its depth in hops per kind, and the runs the cut
would change refused in one line naming the fix."""

from __future__ import annotations

import pytest

from fullgraph.errors import ConfigError
from fullgraph.training import TrainConfig
from fullgraph.training.cut_check import check_cut_training, receptive_depth

META = {"cut": {"hops": 2, "splits": ["train", "val", "test"]}}


@pytest.mark.parametrize(
    ("settings", "depth"),
    [
        ({"model": "gcn", "layers": 2}, 2),
        ({"model": "sage", "layers": 3}, 3),
        ({"model": "mlp", "layers": 3}, 0),
        ({"model": "appnp", "layers": 2}, 10),
        ({"model": "appnp", "layers": 2, "hops": 2}, 2),
        ({"model": "sgc"}, 2),
        ({"model": "sign", "hops": 3}, 3),
    ],
)
def test_receptive_depth(settings, depth) -> None:
    assert receptive_depth(TrainConfig(**settings)) == depth


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"model": "gcn", "layers": 3}, "reads 3 hops .* --cut-hops 3"),
        ({"model": "appnp"}, "reads 10 hops"),
        ({"model": "gcn", "norm": "batch"}, "BatchNorm's statistics"),
        ({"model": "gcn", "correct_smooth": True}, "Correct & Smooth"),
    ],
)
def test_runs_the_cut_would_change_are_refused(settings, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        check_cut_training(META, TrainConfig(**settings), "parts/x")
    assert "\n" not in str(info.value) and "parts/x" in str(info.value)


def test_what_the_cut_keeps_trains() -> None:
    for settings in ({"model": "gcn"}, {"model": "sage", "layers": 1}, {"model": "mlp"}):
        check_cut_training(META, TrainConfig(**settings), "parts/x")
    check_cut_training({}, TrainConfig(model="gcn", layers=5), "parts/x")  # no cut
