"""The score of a link-prediction run, in OGB's conventions: Hits@K, MRR, ROC-AUC and AP.

Pure numpy, no communicator, no torch import (a torch tensor is accepted and copied to the
CPU). Scores are higher for a more likely edge (a logit, a probability, a dot product).

- :func:`hits_at_k` (ogbl-collab, -ppa, -ddi): every positive against one shared pool of
  negatives, as ``ogb.linkproppred.Evaluator``: the share of positives scored strictly above
  the K-th highest negative score; fewer than K negatives give 1.0.
- :func:`mrr` (ogbl-citation2): each positive against its own row of negatives; its rank is
  the mean of the optimistic rank (1 + the negatives scored above it) and the pessimistic one
  (1 + those scored at least as high), so a tie counts half; the mean of 1 / rank. Hits@1, @3
  and @10 of the same ranks come with it in :func:`link_scores`.
- :func:`roc_auc`: the Mann-Whitney statistic, a tie counting one half (what average ranks
  and scikit-learn's ``roc_auc_score`` give), from integer counts, then one division.
- :func:`average_precision`: scikit-learn's ``average_precision_score`` (the sum over the
  distinct score thresholds, highest first, of the recall gained times the precision there;
  tied scores are one threshold).

Every result depends on the multiset of scores only, not on their order (the MRR's sum is
``math.fsum``, correctly rounded), so scores gathered from P ranks in any order give the
figure one process gives. Memory is linear in the scores: no ``[E, N]`` comparison matrix,
and :func:`mrr` compares its ``[E, K]`` rows a bounded block at a time.

:func:`link_scores` gives what a run reports for a split's metric (the metric's own key is
the metric's name: ``link_scores(pos, neg, "hits@50")["hits@50"]``), and
:func:`evaluate_link` takes OGB's input dict (``y_pred_pos``, ``y_pred_neg``); it is what
:func:`fullgraph.evaluate` does for a link metric::

    >>> import numpy as np
    >>> from fullgraph.link_metrics import link_scores
    >>> link_scores(np.array([0.9, 0.4]), np.array([0.1, 0.5]), "auc")
    {'auc': 0.75, 'ap': 0.8333333333333333}
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np

from fullgraph.errors import FullgraphError

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

    #: Scores: a numpy array (or what ``np.asarray`` takes) or a torch tensor (any device).
    Scores = npt.ArrayLike | torch.Tensor

__all__ = [
    "HITS_REPORTED",
    "MRR_HITS",
    "LinkMetricError",
    "average_precision",
    "evaluate_link",
    "hits_at_k",
    "is_link_metric",
    "link_scores",
    "mrr",
    "mrr_ranks",
    "mrr_scores",
    "roc_auc",
]

#: The Hits@K cut-offs OGB's baselines report beside a dataset's own K (ogbl-ddi's 20:
#: 10, 20, 30; ogbl-collab's 50 and ogbl-ppa's 100: 10, 50, 100); another K is reported alone.
HITS_REPORTED: dict[int, tuple[int, ...]] = {
    20: (10, 20, 30),
    50: (10, 50, 100),
    100: (10, 50, 100),
}
#: The Hits@K OGB's MRR evaluator reports with the MRR.
MRR_HITS = (1, 3, 10)
#: Elements of the ``[rows, K]`` comparison :func:`mrr_ranks` makes at a time.
_BLOCK = 1 << 22
_HITS = re.compile(r"hits@([1-9][0-9]*)")


class LinkMetricError(FullgraphError, ValueError):
    """Scores a link metric cannot rank (NaN or infinite, arrays of the wrong shape), or a
    metric name it does not know. A ``ValueError`` too, as :mod:`fullgraph.metrics` raises."""


def _scores(a: Scores, name: str, ndim: int) -> np.ndarray:
    """``a`` as a float64 numpy array of ``ndim`` dimensions of finite scores (checked)."""
    if hasattr(a, "detach"):  # a torch tensor, without importing torch
        a = a.detach().cpu().double().numpy()  # exact from every float dtype, bfloat16 too
    arr = np.asarray(a)
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise LinkMetricError(f"{name} must hold numeric scores, not {arr.dtype}")
    if arr.ndim != ndim:
        want = "[E]" if ndim == 1 else "[E, K]"
        raise LinkMetricError(f"{name} must be {want} scores, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
    if bad:
        raise LinkMetricError(
            f"{name} holds {bad} NaN or infinite scores of {arr.size}; only finite scores rank "
            f"(a model whose scores are not finite has diverged)"
        )
    return arr


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise LinkMetricError(f"Hits@K needs an integer K >= 1, not {k!r}")
    return int(k)


def _hits(pos: np.ndarray, neg: np.ndarray, ks: tuple[int, ...]) -> dict[int, float]:
    """K -> Hits@K of checked scores, OGB's rule, with one partial sort of the negatives."""
    inside = sorted({neg.size - k for k in ks if k <= neg.size})
    ordered = np.partition(neg, inside) if inside else neg
    out = {}
    for k in ks:
        if neg.size < k:
            out[k] = 1.0  # OGB: fewer negatives than K count every positive a hit
        elif pos.size == 0:
            out[k] = float("nan")
        else:
            kth = ordered[neg.size - k]  # the K-th highest negative score
            out[k] = int(np.count_nonzero(pos > kth)) / pos.size
    return out


def hits_at_k(pos: Scores, neg: Scores, k: int) -> float:
    """OGB's Hits@K: the share of positives scored strictly above the K-th highest negative.

    Args:
        pos: scores of the positive pairs [E].
        neg: scores of the negative pairs [N], one pool for every positive.
        k: the cut-off K >= 1.

    Returns:
        Hits@K in [0, 1]; 1.0 when there are fewer than K negatives (as OGB), NaN when there
        are no positives (and at least K negatives).

    Raises:
        LinkMetricError: scores that are not 1-D or not finite, or K < 1 (one line).
    """
    k = _check_k(k)
    return _hits(_scores(pos, "pos", 1), _scores(neg, "neg", 1), (k,))[k]


def mrr_ranks(pos: Scores, neg: Scores) -> np.ndarray:
    """Twice OGB's rank of every positive among its own negatives (an exact integer).

    The rank is ``1 + (#neg > pos + #neg >= pos) / 2``: the mean of the optimistic and the
    pessimistic rank, so it is a half-integer where scores tie; twice it is
    ``2 + #neg > pos + #neg >= pos``. The rows are compared a bounded block at a time.

    Args:
        pos: scores of the positives [E].
        neg: scores of each positive's negatives [E, K] (row i: positive i's).

    Returns:
        int64 [E], twice each rank (>= 2).

    Raises:
        LinkMetricError: shapes that do not match, or scores that are not finite (one line).
    """
    p, n = _scores(pos, "pos", 1), _scores(neg, "neg", 2)
    if n.shape[0] != p.size:
        raise LinkMetricError(
            f"neg must have one row of negatives per positive: {n.shape[0]} rows for {p.size} "
            f"positives"
        )
    twice = np.empty(p.size, dtype=np.int64)
    step = max(1, _BLOCK // max(1, n.shape[1]))
    for a in range(0, p.size, step):
        col = p[a : a + step, None]
        block = n[a : a + step]
        twice[a : a + step] = (
            2 + np.count_nonzero(block > col, axis=1) + np.count_nonzero(block >= col, axis=1)
        )
    return twice


def mrr_scores(twice_ranks: npt.ArrayLike) -> dict[str, float]:
    """``{"mrr", "hits@1", "hits@3", "hits@10"}`` of ranks from :func:`mrr_ranks` (ranks of
    several ranks' edges may be concatenated in any order: the result is the same).

    Args:
        twice_ranks: integers [E], twice each positive's rank.

    Returns:
        The mean of ``1 / rank`` and the share of ranks <= 1, 3, 10 (a half-integer rank
        above K is no hit, as OGB); NaN for every key when there are no positives.
    """
    t = np.asarray(twice_ranks).reshape(-1)
    if t.size == 0:
        return {"mrr": float("nan"), **{f"hits@{k}": float("nan") for k in MRR_HITS}}
    out = {"mrr": math.fsum((2.0 / t.astype(np.float64)).tolist()) / t.size}
    for k in MRR_HITS:
        out[f"hits@{k}"] = int(np.count_nonzero(t <= 2 * k)) / t.size
    return out


def mrr(pos: Scores, neg: Scores) -> float:
    """OGB's mean reciprocal rank of every positive among its own negatives.

    Args:
        pos: scores of the positives [E].
        neg: scores of each positive's negatives [E, K].

    Returns:
        The mean of ``1 / rank`` (:func:`mrr_ranks`: ties count half), NaN for no positives.

    Raises:
        LinkMetricError: shapes that do not match, or scores that are not finite (one line).
    """
    return mrr_scores(mrr_ranks(pos, neg))["mrr"]


def roc_auc(pos: Scores, neg: Scores) -> float:
    """Area under the ROC curve of positive against negative scores.

    The Mann-Whitney statistic: the probability that a positive scores above a negative, a tie
    counting one half (as average ranks and scikit-learn's ``roc_auc_score``). For each
    positive, the negatives below it and those at most it are counted by binary search in the
    sorted negatives; their sum is an integer, divided once.

    Args:
        pos: scores of the positive pairs [E].
        neg: scores of the negative pairs [N].

    Returns:
        The AUC in [0, 1]; NaN when either side is empty.

    Raises:
        LinkMetricError: scores that are not 1-D or not finite (one line).
    """
    p, n = _scores(pos, "pos", 1), _scores(neg, "neg", 1)
    if p.size == 0 or n.size == 0:
        return float("nan")
    ordered = np.sort(n)
    below = np.searchsorted(ordered, p, side="left")  # negatives < the positive
    at_most = np.searchsorted(ordered, p, side="right")  # negatives <= the positive
    twice_u = int(below.sum(dtype=np.int64)) + int(at_most.sum(dtype=np.int64))
    return twice_u / (2 * p.size * n.size)  # Python integers: one correctly rounded division


def average_precision(pos: Scores, neg: Scores) -> float:
    """Average precision of positive against negative scores, as scikit-learn's
    ``average_precision_score``: the sum over the distinct score thresholds, highest first,
    of (recall gained there) x (precision there); tied scores are one threshold.

    Args:
        pos: scores of the positive pairs [E].
        neg: scores of the negative pairs [N].

    Returns:
        AP in [0, 1]; 1.0 with no negatives, NaN with no positives.

    Raises:
        LinkMetricError: scores that are not 1-D or not finite (one line).
    """
    p, n = _scores(pos, "pos", 1), _scores(neg, "neg", 1)
    if p.size == 0:
        return float("nan")
    scores = np.concatenate([p, n])
    is_pos = np.concatenate([np.ones(p.size, dtype=bool), np.zeros(n.size, dtype=bool)])
    order = np.argsort(-scores, kind="stable")  # highest first
    scores, is_pos = scores[order], is_pos[order]
    # the last position of every run of equal scores: one threshold each
    ends = np.append(np.flatnonzero(scores[1:] != scores[:-1]), scores.size - 1)
    tps = np.cumsum(is_pos, dtype=np.int64)[ends]  # positives at or above the threshold
    predicted = ends + 1  # pairs at or above it
    gained = np.diff(tps, prepend=0)
    return float(np.sum(gained * (tps / predicted))) / p.size


def is_link_metric(metric: str) -> bool:
    """Whether ``metric`` names a link metric: ``hits@K`` (K >= 1), ``mrr`` or ``auc``."""
    return metric in ("mrr", "auc") or _HITS.fullmatch(metric) is not None


def link_scores(pos: Scores, neg: Scores, metric: str) -> dict[str, float]:
    """What a link-prediction split reports under ``metric`` (its own key: ``metric``).

    Args:
        pos: scores of the positives [E].
        neg: ``hits@K`` and ``auc``: scores of the negatives [N] (one pool); ``mrr``: each
            positive's own negatives [E, K].
        metric: ``hits@K``, ``mrr`` or ``auc`` (``fullgraph.datasets.link.LinkSplit.metric``).

    Returns:
        ``hits@K``: ``{"hits@K"}`` and the other cut-offs OGB reports for that K
        (:data:`HITS_REPORTED`; one partial sort serves them all); ``mrr``: ``{"mrr",
        "hits@1", "hits@3", "hits@10"}``; ``auc``: ``{"auc", "ap"}``.

    Raises:
        LinkMetricError: an unknown metric, or scores :func:`hits_at_k`, :func:`mrr`,
            :func:`roc_auc` refuse (one line).
    """
    if metric == "mrr":
        return mrr_scores(mrr_ranks(pos, neg))
    if metric == "auc":
        return {"auc": roc_auc(pos, neg), "ap": average_precision(pos, neg)}
    m = _HITS.fullmatch(metric)
    if m is None:
        raise LinkMetricError(f"the link metric must be hits@K, mrr or auc, not {metric!r}")
    k = int(m.group(1))
    ks = tuple(sorted({k, *HITS_REPORTED.get(k, ())}))
    hits = _hits(_scores(pos, "pos", 1), _scores(neg, "neg", 1), ks)
    return {f"hits@{j}": hits[j] for j in ks}


def evaluate_link(input_dict: dict[str, Scores], metric: str) -> dict[str, float]:
    """Score link predictions from OGB's input dict, as ``ogb.linkproppred.Evaluator.eval``.

    Args:
        input_dict: ``{"y_pred_pos": [E], "y_pred_neg": [N] or (mrr) [E, K]}``, numpy arrays
            or torch tensors.
        metric: ``hits@K``, ``mrr``, ``auc``, or ``rocauc`` (OGB's name for ogbl-vessel's).

    Returns:
        ``hits@K``: ``{"hits@K"}`` alone (as OGB); ``mrr``: ``{"mrr", "hits@1", "hits@3",
        "hits@10"}``, the means of OGB's ``*_list`` arrays; ``auc``: ``{"auc", "ap"}``;
        ``rocauc``: ``{"rocauc"}``.

    Raises:
        LinkMetricError: a missing key, an unknown metric or scores the metric refuses.
    """
    for key in ("y_pred_pos", "y_pred_neg"):
        if key not in input_dict:
            raise LinkMetricError(f"input_dict needs {key!r} for the link metric {metric!r}")
    pos, neg = input_dict["y_pred_pos"], input_dict["y_pred_neg"]
    if metric == "rocauc":
        return {"rocauc": roc_auc(pos, neg)}
    m = _HITS.fullmatch(metric)
    if m is not None:
        return {metric: hits_at_k(pos, neg, int(m.group(1)))}
    return link_scores(pos, neg, metric)
