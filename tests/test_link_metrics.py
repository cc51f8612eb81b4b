"""The link-prediction metrics against ogb.linkproppred.Evaluator and scikit-learn.

Enters through :mod:`fullgraph.link_metrics`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ogb.linkproppred import Evaluator
from sklearn.metrics import average_precision_score, roc_auc_score

import fullgraph
from fullgraph import link_metrics
from fullgraph.errors import FullgraphError
from fullgraph.link_metrics import (
    LinkMetricError,
    average_precision,
    hits_at_k,
    link_scores,
    mrr,
    mrr_ranks,
    roc_auc,
)
from fullgraph.metrics import roc_auc as labelled_roc_auc


def tied_scores(rng: np.random.Generator, shape: tuple[int, ...], levels: int) -> np.ndarray:
    """float32 scores of ``shape`` taking ``levels`` distinct values (few levels: many ties)."""
    return (rng.integers(0, levels, size=shape) / 7.0 - 1.5).astype(np.float32)


@pytest.mark.parametrize(("name", "k"), [("ogbl-ddi", 20), ("ogbl-collab", 50), ("ogbl-ppa", 100)])
@pytest.mark.parametrize("levels", [6, 40, 10_000])
def test_hits_match_ogb(name: str, k: int, levels: int) -> None:
    rng = np.random.default_rng(k + levels)
    pos, neg = tied_scores(rng, (500,), levels), tied_scores(rng, (3000,), levels)
    want = Evaluator(name).eval({"y_pred_pos": pos, "y_pred_neg": neg})[f"hits@{k}"]
    assert hits_at_k(pos, neg, k) == want
    # torch tensors (OGB's torch path: topk) and float64 give the same
    got_torch = hits_at_k(torch.from_numpy(pos), torch.from_numpy(neg), k)
    assert got_torch == want
    on_torch = {"y_pred_pos": torch.from_numpy(pos), "y_pred_neg": torch.from_numpy(neg)}
    assert Evaluator(name).eval(on_torch)[f"hits@{k}"] == want
    scores = link_scores(pos.astype(np.float64), neg, f"hits@{k}")
    assert scores[f"hits@{k}"] == want
    assert set(scores) == {f"hits@{j}" for j in link_metrics.HITS_REPORTED[k]}
    for j, value in scores.items():
        assert value == hits_at_k(pos, neg, int(j.split("@")[1]))


def test_hits_with_ties_at_the_kth_negative_and_too_few_negatives() -> None:
    neg = np.array([5.0, 4.0, 3.0, 3.0, 1.0])
    pos = np.array([3.0, 3.5, 4.0, 6.0])
    # K = 3: the third highest negative is 3.0; a positive at 3.0 is no hit (strictly above)
    assert hits_at_k(pos, neg, 3) == 3 / 4
    assert hits_at_k(pos, neg, 4) == 3 / 4  # the fourth is 3.0 too
    assert hits_at_k(pos, neg, 5) == 1.0  # above 1.0: every positive
    assert hits_at_k(pos, neg, 6) == 1.0  # fewer negatives than K: 1.0, as OGB
    ogb = Evaluator("ogbl-ddi").eval({"y_pred_pos": pos, "y_pred_neg": neg[:3]})
    assert ogb == {"hits@20": 1.0} and hits_at_k(pos, neg[:3], 20) == 1.0
    assert np.isnan(hits_at_k(np.zeros(0), neg, 2))


@pytest.mark.parametrize("levels", [3, 25, 1_000_000])
def test_mrr_matches_ogb(levels: int) -> None:
    rng = np.random.default_rng(levels)
    pos, neg = tied_scores(rng, (700,), levels), tied_scores(rng, (700, 30), levels)
    # OGB's numpy branch calls .sum(dim=1) on an ndarray; its torch branch is the one that runs
    ogb = Evaluator("ogbl-citation2").eval(
        {"y_pred_pos": torch.from_numpy(pos), "y_pred_neg": torch.from_numpy(neg)}
    )
    got = link_scores(pos, neg, "mrr")
    assert set(got) == {"mrr", "hits@1", "hits@3", "hits@10"}
    for key in got:
        want = float(ogb[f"{key}_list"].double().mean())
        # OGB takes 1 / rank in float32; the hits are exact shares either way
        assert got[key] == pytest.approx(want, rel=1e-6, abs=0), key
    assert mrr(pos, neg) == got["mrr"]
    assert mrr(torch.from_numpy(pos), torch.from_numpy(neg)) == got["mrr"]


def test_mrr_ranks_are_half_integers_on_ties_and_blocks_change_nothing(monkeypatch) -> None:
    pos = np.array([1.0, 1.0, 2.0])
    neg = np.array([[1.0, 0.0, 3.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    # row 0: one above, one tied: rank 1 + (1 + 2) / 2 = 2.5; row 1: 1; row 2: 1 + 3/2 = 2.5
    assert mrr_ranks(pos, neg).tolist() == [5, 2, 5]
    assert mrr(pos, neg) == pytest.approx((1 / 2.5 + 1 + 1 / 2.5) / 3, rel=1e-15)
    rng = np.random.default_rng(3)
    pos, neg = tied_scores(rng, (101,), 9), tied_scores(rng, (101, 13), 9)
    whole = mrr_ranks(pos, neg)
    monkeypatch.setattr(link_metrics, "_BLOCK", 20)  # 1 row of 13 at a time
    assert np.array_equal(mrr_ranks(pos, neg), whole)
    monkeypatch.setattr(link_metrics, "_BLOCK", 40)  # 3 rows, the last block short
    assert np.array_equal(mrr_ranks(pos, neg), whole)


@pytest.mark.parametrize("levels", [2, 7, 300, 1_000_000])
@pytest.mark.parametrize(("n_pos", "n_neg"), [(1, 1), (5, 400), (900, 900), (2000, 30)])
def test_auc_and_ap_match_sklearn(levels: int, n_pos: int, n_neg: int) -> None:
    rng = np.random.default_rng(levels * 31 + n_pos)
    pos = tied_scores(rng, (n_pos,), levels) + np.float32(0.2)  # positives a little higher
    neg = tied_scores(rng, (n_neg,), levels)
    truth = np.concatenate([np.ones(n_pos), np.zeros(n_neg)])
    both = np.concatenate([pos, neg])
    assert roc_auc(pos, neg) == pytest.approx(roc_auc_score(truth, both), rel=1e-12, abs=1e-15)
    ap = average_precision_score(truth, both)
    assert average_precision(pos, neg) == pytest.approx(ap, rel=1e-12, abs=1e-15)
    # the node metric's average-rank Mann-Whitney: the same bits
    assert roc_auc(pos, neg) == labelled_roc_auc(truth, both)
    assert link_scores(pos, neg, "auc") == {
        "auc": roc_auc(pos, neg),
        "ap": average_precision(pos, neg),
    }
    ogb = Evaluator("ogbl-vessel").eval({"y_pred_pos": pos, "y_pred_neg": neg})["rocauc"]
    assert roc_auc(pos, neg) == pytest.approx(ogb, rel=1e-12)


def test_auc_and_ap_edges() -> None:
    assert roc_auc(np.array([1.0, 1.0]), np.array([1.0])) == 0.5  # all tied
    assert average_precision(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.5
    assert average_precision(np.array([0.3]), np.zeros(0)) == 1.0
    assert np.isnan(roc_auc(np.zeros(0), np.ones(3)))
    assert np.isnan(roc_auc(np.ones(3), np.zeros(0)))
    assert np.isnan(average_precision(np.zeros(0), np.ones(3)))


@pytest.mark.parametrize("metric", ["hits@20", "hits@7", "mrr", "auc"])
def test_results_do_not_depend_on_the_order_of_the_scores(metric: str) -> None:
    rng = np.random.default_rng(11)
    n = 400
    pos = tied_scores(rng, (n,), 50)
    neg = tied_scores(rng, (n, 10) if metric == "mrr" else (3 * n,), 50)
    want = link_scores(pos, neg, metric)
    for _ in range(3):
        p = rng.permutation(n)
        shuffled_neg = neg[p] if metric == "mrr" else rng.permutation(neg)
        assert link_scores(pos[p], shuffled_neg, metric) == want  # bit for bit


def test_fullgraph_evaluate_takes_ogbs_link_input_dict() -> None:
    rng = np.random.default_rng(5)
    pos, neg = tied_scores(rng, (300,), 30), tied_scores(rng, (2000,), 30)
    d = {"y_pred_pos": pos, "y_pred_neg": neg}
    assert fullgraph.evaluate(d, "hits@50") == Evaluator("ogbl-collab").eval(d)
    assert fullgraph.evaluate(d, "auc") == link_scores(pos, neg, "auc")
    assert fullgraph.evaluate(d, "rocauc") == {"rocauc": roc_auc(pos, neg)}
    rows = tied_scores(rng, (300, 20), 30)
    got = fullgraph.evaluate({"y_pred_pos": torch.from_numpy(pos), "y_pred_neg": rows}, "mrr")
    assert got == link_scores(pos, rows, "mrr")
    # node classification is unchanged
    y = np.array([[0], [1], [1]])
    node = {"y_true": y, "y_pred": np.array([[0.1], [0.4], [0.9]])}
    assert fullgraph.evaluate(node, "rocauc") == {"rocauc": 1.0}
    with pytest.raises(LinkMetricError, match="needs 'y_pred_neg'"):
        fullgraph.evaluate({"y_pred_pos": pos}, "mrr")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: hits_at_k(np.array([np.nan, 1.0]), np.ones(3), 2), "pos holds 1 NaN"),
        (lambda: roc_auc(np.ones(3), np.array([np.inf])), "neg holds 1 NaN or infinite"),
        (lambda: average_precision(np.ones((3, 1)), np.ones(3)), r"pos must be \[E\] scores"),
        (lambda: hits_at_k(np.ones(3), np.ones(3), 0), "integer K >= 1"),
        (lambda: mrr(np.ones(3), np.ones(3)), r"neg must be \[E, K\] scores"),
        (lambda: mrr(np.ones(3), np.ones((4, 2))), "4 rows for 3 positives"),
        (lambda: link_scores(np.ones(3), np.ones(3), "hits@0"), "hits@K, mrr or auc"),
        (lambda: link_scores(np.ones(3), np.ones(3), "map"), "hits@K, mrr or auc"),
        (lambda: roc_auc(np.array(["a"]), np.ones(1)), "numeric scores"),
    ],
)
def test_bad_input_is_one_line(call, message: str) -> None:
    with pytest.raises(LinkMetricError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
    assert isinstance(info.value, FullgraphError) and isinstance(info.value, ValueError)
