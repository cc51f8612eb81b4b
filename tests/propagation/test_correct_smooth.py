"""Correct & Smooth in one process: PyG's ``CorrectAndSmooth`` to 1e-6, the options, the
binary metric, the refusals.

- parity: the same logits and training mask through PyG's ``correct`` then ``smooth`` (its own
  ``gcn_norm`` of the edge index, no self-loops) and through :class:`CorrectSmooth` on the
  whole graph's part (rows in block order, mapped back to global ids), with autoscale and with
  a fixed scale, and each stage alone;
- the options: defaults (PyG's products example), ``auto``, one-line refusals of alpha outside
  (0, 1], layers below 0 or beyond :data:`MAX_CS_LAYERS`, a scale that is not a number > 0,
  a parameter without ``--correct-smooth``; a graph without training nodes;
- ROC-AUC on a binary task scores a node by its smoothed positive-class column.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.halo import HaloPlan
from fullgraph.errors import ConfigError
from fullgraph.metrics import roc_auc
from fullgraph.partition import whole_graph_part
from fullgraph.propagation.correct_smooth import (
    MAX_CS_LAYERS,
    CorrectSmooth,
    CorrectSmoothOptions,
    CorrectSmoothParams,
    parse_scale,
    smoothed_metrics,
)
from fullgraph.training.config import TrainConfig

pyg_models = pytest.importorskip("torch_geometric.nn.models")

TOL = 1e-6
#: (name, parameters): autoscale with PyG's own defaults of alpha, a fixed scale as PyG's
#: products example (fewer steps), and alphas below 1 in both stages
CASES = {
    "autoscale": CorrectSmoothParams(10, 0.8, 10, 0.6, None),
    "fixed": CorrectSmoothParams(20, 1.0, 20, 0.8, 20.0),
    "fixed-half": CorrectSmoothParams(5, 0.5, 7, 0.9, 1.5),
}


def _logits(num_nodes: int, num_classes: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(num_nodes, num_classes, generator=g)


def _ours(graph, logits: torch.Tensor, params: CorrectSmoothParams, stage: str = "both"):
    """C&S of ``logits`` (global order) on the whole graph's part, back in global order."""
    part = whole_graph_part(graph)
    comm = Communicator()
    plan = HaloPlan.from_partition(part, comm)
    cs = CorrectSmooth.of_part(part, plan, params)
    gids = torch.from_numpy(np.asarray(part.global_ids[: part.num_inner], dtype=np.int64))
    local = logits[gids]
    if stage == "both":
        out = cs(local)
    elif stage == "correct":
        out = cs.correct(torch.softmax(local, dim=1))
    else:
        out = cs.smooth(torch.softmax(local, dim=1))
    back = torch.empty_like(out)
    back[gids] = out
    return back, cs


def _pyg(graph, logits: torch.Tensor, params: CorrectSmoothParams, stage: str = "both"):
    """PyG's C&S of the same logits over the graph's edge index."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    edge_index = torch.from_numpy(np.stack([graph.indices, dst]).astype(np.int64))
    model = pyg_models.CorrectAndSmooth(
        params.correction_layers,
        params.correction_alpha,
        params.smoothing_layers,
        params.smoothing_alpha,
        autoscale=params.autoscale,
        scale=params.scale if params.scale is not None else 1.0,
    )
    mask = torch.from_numpy(graph.train_mask)
    y_train = torch.from_numpy(graph.y)[mask]
    y_soft = torch.softmax(logits, dim=1)
    if stage in ("both", "correct"):
        y_soft = model.correct(y_soft, y_train, mask, edge_index)
    if stage in ("both", "smooth"):
        y_soft = model.smooth(y_soft, y_train, mask, edge_index)
    return y_soft


@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_pyg_correct_and_smooth(case: str, small_graph) -> None:
    params = CASES[case]
    logits = _logits(small_graph.num_nodes, small_graph.num_classes)
    got, _ = _ours(small_graph, logits, params)
    want = _pyg(small_graph, logits, params)
    err = float((got - want).abs().max())  # scores in [0, 1]
    assert err <= TOL, (case, err)
    # it did something: the smoothed scores are not the softmax
    assert float((got - torch.softmax(logits, dim=1)).abs().max()) > 0.1


@pytest.mark.parametrize("stage", ["correct", "smooth"])
@pytest.mark.parametrize("case", ["autoscale", "fixed"])
def test_each_stage_equals_pyg(stage: str, case: str, small_graph) -> None:
    params = CASES[case]
    logits = _logits(small_graph.num_nodes, small_graph.num_classes, seed=1)
    got, _ = _ours(small_graph, logits, params, stage)
    want = _pyg(small_graph, logits, params, stage)
    # corrected scores are Z + scale E, up to ~20 here: 1e-6 of their size (float32 rounding)
    assert bool(((got - want).abs() <= TOL * (1 + want.abs())).all())


def test_autoscale_sigma_is_the_mean_training_error(small_graph) -> None:
    """``sigma`` through the block tree: PyG's ``error[mask].abs().sum() / numel`` to float
    rounding (every block's partial and the tree are float32)."""
    logits = _logits(small_graph.num_nodes, small_graph.num_classes, seed=2)
    _, cs = _ours(small_graph, logits, CASES["autoscale"])
    assert cs.blocks is not None and cs.blocks.num_blocks > 1
    y_soft = torch.softmax(logits, dim=1)
    mask = torch.from_numpy(small_graph.train_mask)
    labels = torch.from_numpy(small_graph.y).clamp(min=0)  # -1: unlabelled, in no mask
    onehot = torch.nn.functional.one_hot(labels, y_soft.shape[1])
    want = (onehot[mask] - y_soft[mask]).abs().double().sum() / int(mask.sum())
    part = whole_graph_part(small_graph)
    gids = torch.from_numpy(np.asarray(part.global_ids[: part.num_inner], dtype=np.int64))
    error = torch.zeros_like(y_soft)
    error[mask] = onehot[mask].float() - y_soft[mask]
    got = cs.sigma(error[gids])
    assert abs(float(got) - float(want)) <= 1e-6 * float(want)


def test_options_defaults_and_auto() -> None:
    assert CorrectSmoothOptions().correct_smooth_params() is None
    params = CorrectSmoothOptions(correct_smooth=True).correct_smooth_params()
    assert params == CorrectSmoothParams(50, 1.0, 50, 0.8, 20.0)
    auto = CorrectSmoothOptions(correct_smooth=True, correction_scale=parse_scale("auto"))
    assert auto.correct_smooth_params().autoscale
    assert auto.correct_smooth_params().to_dict()["scale"] == "auto"
    assert parse_scale(" 3.5") == 3.5
    cfg = TrainConfig(correct_smooth=True, smoothing_layers=0)
    assert cfg.correct_smooth_params().smoothing_layers == 0
    assert cfg.to_dict()["correct_smooth"] is True


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"correction_alpha": 0.0}, "--correction-alpha must be in (0, 1], not 0"),
        ({"smoothing_alpha": 1.5}, "--smoothing-alpha must be in (0, 1], not 1.5"),
        ({"smoothing_alpha": float("nan")}, "--smoothing-alpha must be a finite number"),
        ({"correction_layers": -1}, "--correction-layers must be an integer >= 0"),
        ({"smoothing_layers": MAX_CS_LAYERS + 1}, f"beyond the {MAX_CS_LAYERS} steps"),
        ({"correction_layers": 2.5}, "--correction-layers must be an integer"),
        ({"correction_scale": 0.0}, "--correction-scale must be a finite number > 0"),
        ({"correction_scale": "big"}, "--correction-scale must be auto or a number > 0"),
    ],
)
def test_bad_parameters_are_refused_in_one_line(values: dict, needle: str) -> None:
    for cls in (CorrectSmoothOptions, TrainConfig):
        with pytest.raises(ConfigError) as err:
            cls(correct_smooth=True, **values)
        assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_parameter_without_correct_smooth_is_refused() -> None:
    for cls in (CorrectSmoothOptions, TrainConfig):
        with pytest.raises(ConfigError, match="--smoothing-alpha applies to Correct & Smooth"):
            cls(smoothing_alpha=0.5)
    with pytest.raises(ConfigError, match="must be auto or a number"):
        parse_scale("twenty")


def test_a_graph_without_training_nodes_is_refused(small_graph) -> None:
    part = whole_graph_part(small_graph)
    plan = HaloPlan.from_partition(part, Communicator())
    with pytest.raises(ConfigError, match="has none in its train split"):
        CorrectSmooth.of_part(dataclasses.replace(part, num_train_global=0), plan, CASES["fixed"])


def test_rocauc_scores_the_smoothed_positive_class(make_graph) -> None:
    """Binary task: both columns propagated; the AUC is that of column 1 (the two columns do
    not sum to 1 after smoothing, so ``column 1 - column 0`` would rank otherwise)."""
    graph = make_graph(num_nodes=300, num_classes=2, num_blocks=2, seed=4)
    logits = _logits(graph.num_nodes, 2, seed=3)
    scores, cs = _ours(graph, logits, CASES["fixed-half"])
    assert float((scores.sum(dim=1) - 1).abs().max()) > 1e-3  # not probabilities any more
    y = torch.from_numpy(graph.y)
    masks = {k: torch.from_numpy(getattr(graph, f"{k}_mask")) for k in ("train", "val", "test")}
    got = smoothed_metrics(scores, y, masks, Communicator(), "rocauc")
    m = masks["test"]
    assert got["test_rocauc"] == roc_auc(y[m].numpy(), scores[m, 1].numpy())
    acc = smoothed_metrics(scores, y, masks, Communicator(), "acc")
    assert acc["test_acc"] == float((scores[m].argmax(1) == y[m]).double().mean())
