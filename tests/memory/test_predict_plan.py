"""``fullgraph predict``'s memory: modelled (``fullgraph plan --predict``) and measured.

- the replay of predict's pass (``mode="predict"``) keeps no saved activations, holds the
  parameters twice (the model and the file's copy) instead of gradients and Adam's moments, and
  peaks at most where training peaks, for gcn, sage and gat, with ``--norm`` and
  ``--residual``;
- ``fullgraph plan --predict`` prints predict's table and the training peak beside it;
- measured on a 1-part partition (fresh processes): predict's peak RSS is at most training's
  for the same model and parts, and within a loose bracket of the plan's prediction.

Enters through :mod:`fullgraph.memory.model`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fullgraph.cli import main as cli_main
from fullgraph.memory.model import TERMS, GraphShape, PartShape, parameter_count, predict
from fullgraph.training.config import TrainConfig

MIB = 2**20


def _shape(num_parts: int, n: int = 100_000, halo: float = 0.5, deg: int = 20) -> GraphShape:
    per = n // num_parts
    h = 0 if num_parts == 1 else int(halo * per)
    part = PartShape(0, per, h, deg * per, h, per // 10, deg * h // 4)
    return GraphShape("synthetic", num_parts, 100, 47, tuple([part] * num_parts))


CONFIGS = [
    TrainConfig(model="gcn", layers=3, hidden=256),
    TrainConfig(model="sage", layers=3, hidden=256, norm="batch"),
    TrainConfig(model="gcn", layers=2, hidden=64, norm="layer", residual=True),
    TrainConfig(model="sage", layers=2, hidden=128, input_dropout=0.0),
    TrainConfig(model="gat", layers=2, hidden=16, heads=4),
    TrainConfig(model="gcn", layers=2, hidden=64, compress_fwd="int8", error_feedback=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.model}-{c.norm}-{c.residual}")
def test_predict_is_modelled_below_training(cfg: TrainConfig) -> None:
    floor = 300 * MIB
    for parts in (1, 4):
        shape = _shape(parts)
        trained = predict(shape, cfg, floor)[0]
        pred = predict(shape, cfg, floor, mode="predict")[0]
        assert pred.total == sum(pred.terms.values()) and set(pred.terms) == set(TERMS)
        assert pred.phase.startswith("predict") or pred.phase == "setup", pred.phase
        assert pred.terms["saved"] <= trained.terms["saved"]
        if cfg.norm != "batch":  # BatchNorm's kept output buffer is all there is to save
            assert pred.terms["saved"] == 0
        p = parameter_count(cfg, 100, 47)
        # at the peak: the parameters and the model file's copy, or none yet (set-up)
        assert pred.terms["optimizer"] in (0, 8 * p)
        assert pred.terms["compression"] == 0 and pred.terms["floor"] == floor
        assert pred.total <= trained.total, (parts, pred, trained)


def test_plan_predict_prints_the_table_and_the_training_peak(capsys, small_partitions) -> None:
    parts = str(small_partitions[2])
    for model in (["--model", "sage", "--norm", "batch"], ["--model", "gat", "--heads", "2"]):
        code = cli_main(["plan", "--parts", parts, *model, "--predict", "--floor-mb", "300"])
        out = capsys.readouterr().out
        assert code == 0
        assert "per rank of `fullgraph predict`" in out and " parameters " in out
        assert "training the same model peaks at" in out and out.count(": fits") == 1
        rows = [ln.split() for ln in out.splitlines() if ln.strip()[:2] in ("0 ", "1 ")]
        assert len(rows) == 2
        for r in rows:  # the terms add up to the total, each cell rounded to 1 MiB
            terms = [float(c) for c in r[4 : 4 + len(TERMS)]]
            assert abs(sum(terms) - float(r[4 + len(TERMS)])) <= len(TERMS)
            assert float(r[4 + 2]) == 0  # saved: nothing is kept for a backward pass
    code = cli_main(["plan", "--parts", parts, "--model", "sage", "--floor-mb", "300"])
    assert code == 0 and "of training, MiB" in capsys.readouterr().out


def _peak_of_log(path: Path) -> float:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return max(r.get("peak_rss_mb", 0.0) for r in rows)


@pytest.mark.timeout(300)
def test_measured_predict_peak_is_at_most_trainings(small_partitions, tmp_path: Path) -> None:
    parts = str(small_partitions[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    model = ["--model", "gcn", "--layers", "3", "--hidden", "64"]
    fg = [sys.executable, "-m", "fullgraph.cli"]

    def run(*args: str) -> str:
        proc = subprocess.run([*fg, *args], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    log = tmp_path / "t.jsonl"
    run(
        "train",
        "--parts",
        parts,
        *model,
        "--epochs",
        "3",
        "--threads",
        "1",
        "--quiet",
        "--log-json",
        str(log),
    )
    out = tmp_path / "pred"
    run(
        "predict",
        "--parts",
        parts,
        "--model",
        str(tmp_path / "t.model.pt"),
        "--out",
        str(out),
        "--embeddings",
        "1,2",
        "--threads",
        "1",
        "--quiet",
    )
    measured = json.loads((out / "predict.json").read_text())["peak_rss_mb"][0]
    trained = _peak_of_log(log)
    assert measured <= trained, (measured, trained)
    plan = run("plan", "--parts", parts, *model, "--predict")
    row = next(ln for ln in plan.splitlines() if ln.strip().startswith("0 "))
    predicted = float(row.split()[4 + len(TERMS)])
    assert 0.7 * predicted <= measured <= 1.3 * predicted, (predicted, measured)


def test_a_deep_model_is_extended_in_predict_mode_too() -> None:
    from fullgraph.memory.model import REPLAYED_LAYERS, predict_quickly

    cfg = TrainConfig(model="sage", layers=REPLAYED_LAYERS + 8, hidden=16)
    shape = _shape(2, n=2000)
    quick = predict_quickly(shape, cfg, 0, mode="predict")[0]
    exact = predict(shape, cfg, 0, mode="predict")[0]
    assert quick.total <= exact.total and "extended" in quick.phase
    assert quick.total >= 0.9 * exact.total
    shallow = predict(shape, replace(cfg, layers=2), 0, mode="predict")[0]
    assert shallow.total < exact.total
