"""``--resume`` refuses every change of what the checkpoint trained with that alters the losses
from the resumed epoch on, the learning-rate schedule included (:data:`MODEL_KEYS`,
:data:`MATCH_WHEN`), naming the old and the new value."""

from __future__ import annotations

from pathlib import Path

import pytest

from fullgraph.errors import ConfigError
from fullgraph.run.checkpoint import CheckpointDir
from fullgraph.training.config import TrainConfig


def _checkpoint(directory: Path, **config: object) -> dict:
    """A checkpoint of epoch 3 of ``TrainConfig(**config)`` in ``directory``; its config."""
    saved = TrainConfig(**config).to_dict()
    ck = CheckpointDir(directory, 0)
    ck.open()
    ck.save({"epoch": 3, "config": saved, "partition_hash": "h"})
    ck.close()
    return saved


def _resume(directory: Path, config: dict) -> None:
    ck = CheckpointDir(directory, 0, resume=True)
    ck.open()
    try:
        ck.load(config, "h")
    finally:
        ck.close()


@pytest.mark.parametrize(
    ("saved", "changed", "needle"),
    [
        ({"lr_warmup": 2}, {"lr_warmup": 5}, "has lr_warmup=2, this run has 5"),
        ({}, {"lr_warmup": 1}, "has lr_warmup=0, this run has 1"),
        ({}, {"lr_schedule": "cosine"}, "lr_schedule='constant', this run has 'cosine'"),
        ({"lr_schedule": "cosine"}, {"epochs": 300}, "epochs=200, this run has 300 (under"),
        ({"lr": 0.01}, {"lr": 0.02}, "has lr=0.01, this run has 0.02"),
        ({"model": "gcn"}, {"improved": True}, "has improved=False, this run has True"),
    ],
)
def test_a_resume_that_changes_the_schedule_is_refused(
    saved: dict, changed: dict, needle: str, tmp_path: Path
) -> None:
    config = _checkpoint(tmp_path / "ck", **saved)
    with pytest.raises(ConfigError, match="--resume: ") as info:
        _resume(tmp_path / "ck", {**config, **changed})
    assert needle in str(info.value), info.value


def test_more_epochs_continue_a_constant_schedule(tmp_path: Path) -> None:
    config = _checkpoint(tmp_path / "ck", lr_warmup=2, epochs=10)
    _resume(tmp_path / "ck", {**config, "epochs": 20})  # constant after the warm-up: unchanged
    cosine = _checkpoint(tmp_path / "cos", lr_schedule="cosine", epochs=10)
    _resume(tmp_path / "cos", cosine)  # an interrupted cosine run resumes as it was
