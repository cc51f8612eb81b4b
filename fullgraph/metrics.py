"""The score of a node-classification run: which metric a dataset is judged by, and the metrics.

Pure numpy, no communicator (:mod:`fullgraph.run.metrics` gathers the ranks' rows and calls
these). Two metrics:

- ``acc``: the share of labelled nodes whose predicted class is their label;
- ``rocauc``: the area under the ROC curve of a binary task, the Mann-Whitney statistic with
  average ranks for tied scores, computed in integers, so that it is exact and does not depend
  on the order of the nodes.

:func:`resolve_metric` picks one: the dataset's own where its source defines one
(:data:`DATASET_METRICS`), else ``rocauc`` for two classes and ``acc`` for more.
:func:`evaluate` follows the convention of OGB's ``Evaluator.eval``::

    >>> import numpy as np
    >>> from fullgraph.metrics import evaluate
    >>> evaluate({"y_true": np.array([[0], [1], [1]]), "y_pred": np.array([[0.1], [0.4], [0.9]])},
    ...          "rocauc")
    {'rocauc': 1.0}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fullgraph.errors import ConfigError
from fullgraph.link_metrics import evaluate_link, is_link_metric

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

    #: Labels, predictions or scores: a numpy array (or what ``np.asarray`` takes) or a torch
    #: tensor (on any device; torch is not imported here).
    Values = npt.ArrayLike | torch.Tensor

__all__ = [
    "DATASET_METRICS",
    "METRICS",
    "METRIC_CHOICES",
    "accuracy",
    "evaluate",
    "resolve_metric",
    "roc_auc",
]

#: The metrics a run can be scored by.
METRICS = ("acc", "rocauc")
#: The values of ``--metric``.
METRIC_CHOICES = ("auto", *METRICS)

#: Datasets whose source defines the metric: heterophilous-graphs (Platonov et al., ICLR 2023:
#: ROC-AUC for its binary sets) and OGB's node-property tasks.
DATASET_METRICS: dict[str, str] = {
    "tolokers": "rocauc",
    "questions": "rocauc",
    "minesweeper": "rocauc",
    "roman-empire": "acc",
    "amazon-ratings": "acc",
    "ogbn-arxiv": "acc",
    "ogbn-products": "acc",
    "ogbn-papers100m": "acc",
    "ogbn-mag": "acc",
    "ogbn-proteins": "rocauc",
}
#: Datasets scored over several binary tasks at once (mean ROC-AUC): not trainable here.
MULTI_LABEL = {"ogbn-proteins": 112}


def _key(dataset: str | None) -> str:
    return (dataset or "").lower().replace("_", "-")


def resolve_metric(metric: str, dataset: str | None, num_classes: int) -> str:
    """The metric a run reports: ``metric`` itself, or for ``auto`` the dataset's own, else
    ``rocauc`` for a binary task and ``acc`` for more classes.

    Args:
        metric: ``auto``, ``acc`` or ``rocauc``.
        dataset: the dataset's name (``meta.json``'s ``dataset``), or ``None``.
        num_classes: its class count.

    Raises:
        ConfigError: an unknown metric, ``rocauc`` for a task that is not binary, or a
            multi-label dataset (one line).
    """
    if metric not in METRIC_CHOICES:
        raise ConfigError(f"--metric must be one of {', '.join(METRIC_CHOICES)}, not {metric!r}")
    name = dataset or "the graph"
    if _key(dataset) in MULTI_LABEL:
        raise ConfigError(
            f"{name} is multi-label ({MULTI_LABEL[_key(dataset)]} binary tasks, scored by mean "
            f"ROC-AUC); fullgraph trains single-label classification only"
        )
    if metric == "auto":
        own = DATASET_METRICS.get(_key(dataset))
        if own is not None and not (own == "rocauc" and num_classes != 2):
            return own
        return "rocauc" if num_classes == 2 else "acc"
    if metric == "rocauc" and num_classes != 2:
        raise ConfigError(
            f"--metric rocauc needs a binary task, but {name} has {num_classes} classes; "
            f"use --metric acc (or auto)"
        )
    return metric


def accuracy(y_true: Values, y_pred: Values) -> float:
    """Share of ``y_pred == y_true`` (class ids of the same length; 0.0 when empty)."""
    t, p = _numpy(y_true).reshape(-1), _numpy(y_pred).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} entries but y_pred {p.size}")
    return float(np.count_nonzero(t == p)) / t.size if t.size else 0.0


def roc_auc(y_true: Values, score: Values) -> float:
    """Area under the ROC curve of binary labels ``y_true`` ranked by ``score``.

    The Mann-Whitney statistic: the probability that a random positive scores above a random
    negative, ties counting one half (average ranks). The rank sums are integers, so the result
    is exact and the same for any order of the nodes.

    Args:
        y_true: 0/1 labels [n].
        score: finite scores [n], higher meaning class 1 (a probability, a logit difference).

    Returns:
        The AUC in [0, 1]; NaN when one of the classes is absent.

    Raises:
        ValueError: lengths differ, a label other than 0/1, or a score that is not finite.
    """
    y = _numpy(y_true).reshape(-1)
    s = _numpy(score).astype(np.float64, copy=False).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"y_true has {y.size} entries but the scores {s.size}")
    if y.size and not np.isin(y, (0, 1)).all():
        raise ValueError("ROC-AUC needs binary labels (0 or 1)")
    if not np.isfinite(s).all():
        raise ValueError("ROC-AUC needs finite scores")
    n = y.size
    n1 = int(np.count_nonzero(y == 1))
    n0 = n - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    ordered = s[order]
    starts = np.concatenate(([0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1))
    ends = np.append(starts[1:], n)
    # twice the average 1-based rank of the tie group [a, b): a + 1 + b
    twice_rank = np.repeat(starts + 1 + ends, ends - starts).astype(np.int64)
    positive_ranks = int(twice_rank[y[order] == 1].sum())
    u_twice = positive_ranks - n1 * (n1 + 1)
    return u_twice / (2 * n1 * n0)  # Python integers: one correctly rounded division


def evaluate(input_dict: dict[str, Values], metric: str) -> dict[str, float]:
    """Score predictions as OGB's ``Evaluator(name).eval(input_dict)`` does.

    A link metric (``hits@K``, ``mrr``, ``auc``), or OGB's link input dict (``y_pred_pos``,
    ``y_pred_neg``), is scored by :func:`fullgraph.link_metrics.evaluate_link`.

    Args:
        input_dict: ``{"y_true": [n, 1] or [n, t], "y_pred": ...}`` as numpy arrays or torch
            tensors; a 1-D array is one task. ``acc``: ``y_pred`` holds class ids of the same
            shape; the mean over tasks of each task's accuracy over its labelled rows (NaN
            labels are unlabelled). ``rocauc``: ``y_pred`` holds scores [n, t]; the mean over
            the tasks that have both classes among their labelled rows. For one task,
            ``y_pred`` may also be two columns (class logits or probabilities): their
            difference ranks the rows as the class-1 probability does.
        metric: ``acc`` or ``rocauc``.

    Returns:
        ``{"acc": float}`` or ``{"rocauc": float}``.

    Raises:
        ValueError: a missing key, shapes that do not match, an unknown metric, or (rocauc)
            no task with both classes.
    """
    if is_link_metric(metric) or "y_pred_pos" in input_dict:
        return evaluate_link(input_dict, metric)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    for key in ("y_true", "y_pred"):
        if key not in input_dict:
            raise ValueError(f"input_dict needs {key!r}")
    y_true, y_pred = _columns(input_dict["y_true"]), _columns(input_dict["y_pred"])
    if metric == "rocauc" and y_true.shape[1] == 1 and y_pred.shape[1] == 2:
        y_pred = y_pred[:, 1:2].astype(np.float64) - y_pred[:, 0:1]
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true has shape {y_true.shape} but y_pred {y_pred.shape}")
    scores = []
    for t in range(y_true.shape[1]):
        labelled = y_true[:, t] == y_true[:, t]  # NaN marks an unlabelled row
        truth, pred = y_true[labelled, t], y_pred[labelled, t]
        if metric == "acc":
            scores.append(accuracy(truth, pred))
        elif (truth == 1).any() and (truth == 0).any():
            scores.append(roc_auc(truth, pred))
    if not scores:
        raise ValueError("no task has both positive and negative labels: ROC-AUC is undefined")
    return {metric: float(sum(scores) / len(scores))}


def _numpy(a: Values) -> np.ndarray:
    """A numpy array of ``a`` (a torch tensor is detached and copied to the CPU)."""
    if hasattr(a, "detach"):  # a torch tensor, without importing torch
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _columns(a: Values) -> np.ndarray:
    """``a`` as [n, t]: a 1-D array is one column."""
    arr = _numpy(a)
    if arr.ndim == 1:
        return arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise ValueError(f"expected [n] or [n, t], got shape {arr.shape}")
    return arr
