"""The metrics: ROC-AUC against a pairwise count, OGB's ``Evaluator`` convention, which metric a
dataset gets, and the per-split metrics of one process (P ranks: tests/commands/test_train.py).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import fullgraph
from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.metrics import accuracy, evaluate, resolve_metric, roc_auc
from fullgraph.partition import whole_graph_part
from fullgraph.run.epochs import accuracies
from fullgraph.run.metrics import split_metrics
from fullgraph.run.options import RunOptions
from fullgraph.training.trainer import TrainConfig, Trainer


def pairwise_auc(y: np.ndarray, s: np.ndarray) -> float:
    """Every (positive, negative) pair: 1 when the positive scores higher, 1/2 on a tie."""
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (pos.size * neg.size))


@pytest.mark.parametrize("seed", range(20))
def test_roc_auc_equals_the_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]  # both classes
    levels = int(rng.integers(1, 8))  # few distinct scores: many ties (one level: all tied)
    s = rng.integers(0, levels, n).astype(np.float32) / 3
    assert roc_auc(y, s) == pytest.approx(pairwise_auc(y, s), abs=1e-15)
    # the order of the nodes does not matter, to the last bit
    perm = rng.permutation(n)
    assert roc_auc(y[perm], s[perm]) == roc_auc(y, s)


def test_roc_auc_edges() -> None:
    assert roc_auc([0, 1], [0.0, 1.0]) == 1.0
    assert roc_auc([1, 0], [0.0, 1.0]) == 0.0
    assert roc_auc([0, 1, 0, 1], [5, 5, 5, 5]) == 0.5
    assert np.isnan(roc_auc([1, 1], [0.2, 0.3]))  # one class only: undefined
    assert roc_auc(torch.tensor([0, 1]), torch.tensor([0.1, 0.9])) == 1.0
    with pytest.raises(ValueError, match="binary"):
        roc_auc([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="finite"):
        roc_auc([0, 1], [0.1, float("nan")])
    with pytest.raises(ValueError, match="entries"):
        roc_auc([0, 1, 1], [0.1, 0.2])


#: (input_dict, metric, expected) in OGB's Evaluator convention
OGB_CASES = [
    ({"y_true": [[0], [1], [2], [1]], "y_pred": [[0], [1], [1], [1]]}, "acc", 0.75),
    ({"y_true": [0, 1, 2, 1], "y_pred": [0, 1, 1, 1]}, "acc", 0.75),  # 1-D: one task
    # two tasks: the mean of their accuracies
    ({"y_true": [[0, 1], [1, 1]], "y_pred": [[0, 0], [1, 1]]}, "acc", 0.75),
    ({"y_true": [[0], [1], [1]], "y_pred": [[0.1], [0.4], [0.9]]}, "rocauc", 1.0),
    # task 2 has one class only (skipped, as OGB does); NaN marks an unlabelled row
    (
        {
            "y_true": [[0, 1], [1, 1], [0, 1], [1, np.nan], [np.nan, 1]],
            "y_pred": [[0.3, 0.1], [0.2, 0.2], [0.1, 0.3], [0.9, 0.4], [0.0, 0.5]],
        },
        "rocauc",
        0.75,
    ),
    # one task given as two columns of class logits: their difference ranks the rows
    ({"y_true": [[0], [1], [1], [0]], "y_pred": [[2, 1], [0, 3], [1, 1], [0, 0]]}, "rocauc", 0.875),
]


@pytest.mark.parametrize(("inputs", "metric", "expected"), OGB_CASES)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_evaluate_follows_the_ogb_convention(inputs, metric, expected, kind: str) -> None:
    convert = np.asarray if kind == "numpy" else torch.tensor
    got = evaluate({k: convert(np.asarray(v)) for k, v in inputs.items()}, metric)
    assert got == {metric: pytest.approx(expected, abs=1e-15)}


def test_evaluate_refuses_what_ogb_refuses() -> None:
    with pytest.raises(ValueError, match="both positive and negative"):
        evaluate({"y_true": [[1], [1]], "y_pred": [[0.1], [0.2]]}, "rocauc")
    with pytest.raises(ValueError, match="shape"):
        evaluate({"y_true": [[0], [1]], "y_pred": [[0.1, 0.2, 0.3], [0.2, 0.1, 0.0]]}, "rocauc")
    with pytest.raises(ValueError, match="y_pred"):
        evaluate({"y_true": [0]}, "acc")
    with pytest.raises(ValueError, match="metric"):
        evaluate({"y_true": [0], "y_pred": [0]}, "f1")


def test_fullgraph_evaluate_is_exported_and_import_stays_light() -> None:
    assert fullgraph.evaluate is evaluate
    code = "import sys, fullgraph; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


#: (metric, dataset, classes, resolved or the refusal's words)
RESOLVE_CASES = [
    ("auto", "tolokers", 2, "rocauc"),
    ("auto", "questions", 2, "rocauc"),
    ("auto", "minesweeper", 2, "rocauc"),
    ("auto", "ogbn-arxiv", 40, "acc"),
    ("auto", "ogbn-papers100M", 172, "acc"),
    ("auto", "roman_empire", 18, "acc"),
    ("auto", "cora", 7, "acc"),
    ("auto", "github", 2, "rocauc"),  # binary, its source names no metric
    ("auto", "sbm-test", 1, "acc"),
    ("auto", None, 2, "rocauc"),
    ("acc", "tolokers", 2, "acc"),
    ("rocauc", "bin", 2, "rocauc"),
    ("rocauc", "cora", 7, "--metric rocauc needs a binary task, but cora has 7 classes"),
    ("auto", "ogbn-proteins", 2, "ogbn-proteins is multi-label"),
    ("f1", "cora", 7, "--metric must be one of auto, acc, rocauc"),
]


@pytest.mark.parametrize(("metric", "dataset", "classes", "want"), RESOLVE_CASES)
def test_resolve_metric(metric: str, dataset: str | None, classes: int, want: str) -> None:
    if want in ("acc", "rocauc"):
        assert resolve_metric(metric, dataset, classes) == want
        return
    with pytest.raises(ConfigError, match=want) as info:
        resolve_metric(metric, dataset, classes)
    assert "\n" not in str(info.value)


def test_split_metrics_of_one_process() -> None:
    rng = np.random.default_rng(0)
    n = 200
    logits = torch.from_numpy(rng.standard_normal((n, 2)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 2, n))
    split = torch.from_numpy(rng.integers(0, 3, n))
    masks = {name: split == i for i, name in enumerate(("train", "val", "test"))}
    comm = Communicator()
    got = split_metrics(logits, y, masks, comm, "rocauc")
    assert set(got) == {"train_rocauc", "val_rocauc", "test_rocauc"}
    score = (logits[:, 1] - logits[:, 0]).numpy()
    for name, m in masks.items():
        assert got[f"{name}_rocauc"] == roc_auc(y[m].numpy(), score[m.numpy()])
    # softmax is monotone: the class-1 probability ranks the nodes alike
    prob = torch.softmax(logits.double(), dim=1)[:, 1].numpy()
    m = masks["val"].numpy()
    assert got["val_rocauc"] == pytest.approx(pairwise_auc(y.numpy()[m], prob[m]), abs=1e-15)
    acc = split_metrics(logits, y, masks, comm, "acc")
    assert acc == accuracies(logits.argmax(dim=1), y, masks, comm)
    assert acc["val_acc"] == accuracy(y[masks["val"]], logits.argmax(dim=1)[masks["val"]])
    with pytest.raises(ValueError, match="two classes"):
        split_metrics(torch.zeros(n, 3), y, masks, comm, "rocauc")


def test_best_model_is_picked_by_the_metric_and_a_foreign_history_starts_over(make_graph) -> None:
    """The best epoch is the one of the best validation ROC-AUC; a history that tracked
    accuracy (a checkpoint written before, or under another metric) does not carry over."""
    graph = make_graph(num_classes=2, p_in=0.55, num_features=4, seed=1, name="bin")
    trainer = Trainer(
        whole_graph_part(graph), Communicator(), TrainConfig(epochs=4), RunOptions(quiet=True)
    )
    assert trainer.metric == "rocauc"
    trainer.history.update({"best_val_acc": 2.0, "test_at_best": 3.0, "best_epoch": 7})
    records = io.StringIO()
    final = trainer.fit(records)
    rows = [json.loads(line) for line in records.getvalue().splitlines()][:-1]
    best = max(rows, key=lambda r: r["val_rocauc"])  # the first of equal scores
    assert (final["best_epoch"], final["best_val_rocauc"]) == (best["epoch"], best["val_rocauc"])
    assert final["test_rocauc"] == best["test_rocauc"] and "best_val_acc" not in final
    assert trainer.history["metric"] == "rocauc" and "best_val_acc" not in trainer.history
