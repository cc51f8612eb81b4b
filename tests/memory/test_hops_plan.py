"""The memory model of SGC and SIGN (their hops' precompute and the per-row layers on them).

- the terms add up, float32 and bf16-mixed, training and predict, 1 and 4 ranks;
- the hops are kept with the features: ``4 n (K + 1) F`` for SIGN (``2`` bytes a value under
  bf16-mixed), ``4 n F`` for SGC, whatever ``K``; the precompute's peak (set-up) grows with the
  hops' width and exchanges ``F`` columns per hop (the halo term at P > 1 only);
- input dropout keeps the dropped hops for the weight gradients;
- ``fullgraph plan`` covers both kinds, and a tiny graph's measured peak lies near its
  prediction.

Enters through :mod:`fullgraph.memory.hops`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fullgraph.memory.ledger import TERMS
from fullgraph.memory.model import GraphShape, PartShape, _replay, check_modelled, predict
from fullgraph.training.config import TrainConfig

MIB = 2**20
FLOOR = 300 * MIB


def _shape(num_parts: int, n: int = 100_000, deg: int = 20) -> GraphShape:
    """``n`` nodes split evenly, half a part's rows as halo rows (100 features, 47 classes)."""
    per = n // num_parts
    h = 0 if num_parts == 1 else per // 2
    part = PartShape(0, per, h, deg * per, h, per // 10, deg * h // 4)
    return GraphShape("synthetic", num_parts, 100, 47, tuple([part] * num_parts))


def _setup_features(cfg: TrainConfig, shape: GraphShape) -> int:
    """The features term once the set-up is done (what training starts with)."""
    led = _replay(shape.parts[0], shape, cfg, FLOOR)
    return led.phase_peaks["loss"][1]["features"]


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
@pytest.mark.parametrize("ranks", [1, 4])
@pytest.mark.parametrize("mode", ["train", "predict"])
def test_terms_add_up(precision: str, ranks: int, mode: str) -> None:
    for model in ("sgc", "sign"):
        cfg = TrainConfig(model=model, layers=3, hidden=64, precision=precision, norm="layer")
        check_modelled(cfg)
        got = predict(_shape(ranks), cfg, FLOOR, mode)[0]
        assert got.total == sum(got.terms.values()) and set(got.terms) == set(TERMS)


def test_the_hops_are_kept_with_the_features() -> None:
    shape = _shape(4)
    n, f = shape.parts[0].num_inner, shape.num_features
    t = shape.parts[0].num_train
    off = {"input_dropout": 0.0, "prune": "off"}  # every row in training: nothing copied
    base = _setup_features(TrainConfig(model="mlp", layers=2, **off), shape)
    for k in (1, 3, 5):
        sign = TrainConfig(model="sign", hops=k, **off)
        assert _setup_features(sign, shape) - base == 4 * n * (k + 1) * f, k
        mixed = replace(sign, precision="bf16-mixed")
        assert _setup_features(mixed, shape) - base == 2 * n * (k + 1) * f, k
        sgc = TrainConfig(model="sgc", hops=k, **off)
        assert _setup_features(sgc, shape) - base == 4 * n * f, k
        # --prune auto (the default): the training rows' hops are copied out as well
        auto = replace(sign, prune="auto")
        base_auto = _setup_features(TrainConfig(model="mlp", layers=2, input_dropout=0.0), shape)
        assert _setup_features(auto, shape) - base_auto == 4 * (n + t) * (k + 1) * f, k
        sgc_auto = replace(sgc, prune="auto")  # A^K X of the training rows, F wide
        assert _setup_features(sgc_auto, shape) - base_auto == 4 * (n + t) * f, k


def test_the_precompute_peak_grows_with_the_hops_and_exchanges() -> None:
    one, four = _shape(1), _shape(4)
    peaks = []
    for k in (2, 6):
        led = _replay(four.parts[0], four, TrainConfig(model="sign", hops=k), FLOOR)
        peaks.append(led.phase_peaks["setup"][0])
        assert led.phase_peaks["setup"][1]["halo"] > 0
    assert peaks[1] - peaks[0] >= 4 * four.parts[0].num_inner * 4 * 100
    led = _replay(one.parts[0], one, TrainConfig(model="sign"), FLOOR)
    assert led.phase_peaks["setup"][1]["halo"] == 0


@pytest.mark.parametrize("prune", ["off", "auto"])
def test_input_dropout_keeps_the_dropped_hops(prune: str) -> None:
    """Of every row (``--prune off``), or of the training rows the step runs on (``auto``)."""
    shape = _shape(4)
    part, f = shape.parts[0], shape.num_features
    rows = part.num_inner if prune == "off" else part.num_train
    kept = []
    for p in (0.0, 0.3):
        cfg = TrainConfig(model="sign", hops=2, input_dropout=p, prune=prune)
        led = _replay(part, shape, cfg, FLOOR)
        kept.append(led.phase_peaks["loss"][1]["saved"])
    assert kept[1] - kept[0] == 4 * rows * 3 * f


@pytest.mark.timeout(120)
def test_tiny_graph_prediction_brackets_its_measured_peak(small_partitions, tmp_path: Path) -> None:
    """One process on a 1-part partition of its own: ``fullgraph plan``, then ``fullgraph
    train --model sign`` (the hops computed and cached); peak RSS of the child."""
    import shutil

    parts = tmp_path / "parts"
    shutil.copytree(small_partitions[1], parts)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    model = ["--model", "sign", "--hops", "3", "--hidden", "64"]
    plan = subprocess.run(
        [sys.executable, "-m", "fullgraph.cli", "plan", "--parts", str(parts), *model],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert plan.returncode == 0, plan.stderr
    row = next(ln for ln in plan.stdout.splitlines() if ln.strip().startswith("0 "))
    predicted = float(row.split()[4 + len(TERMS)])
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    train = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-m", "fullgraph.cli", "train"]
        + ["--parts", str(parts), *model, "--threads", "1", "--epochs", "3", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert train.returncode == 0, train.stderr
    measured = int(train.stdout.split()[-1]) / 1024
    assert 0.7 * predicted <= measured <= 1.3 * predicted, (predicted, measured)
