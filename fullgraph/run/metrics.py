"""The run's metric over all ranks: each rank holds the logits of its own rows.

``acc`` all-reduces the correct and total counts of every split (:func:`~fullgraph.run.epochs.
accuracies`, one fixed-order sum). ``rocauc`` cannot be summed from per-rank pieces: every rank
sends the (score, label) pairs of its split rows to every rank, and every rank computes the AUC
of the whole split with :func:`fullgraph.metrics.roc_auc`, which depends on the multiset of
pairs only, not on their order, so P ranks report what one process reports.
"""

from __future__ import annotations

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.metrics import METRICS, roc_auc
from fullgraph.run.epochs import SPLITS, accuracies


def split_metrics(
    logits: torch.Tensor,
    y: torch.Tensor,
    masks: dict[str, torch.Tensor],
    comm: Communicator,
    metric: str,
) -> dict[str, float]:
    """``{split}_{metric}`` for the train, val and test splits over all ranks (a collective:
    every rank calls it and gets the same dict).

    Args:
        logits: this rank's rows' class logits.
        y: their labels.
        masks: ``train``/``val``/``test`` boolean masks of the same rows.
        comm: the communicator.
        metric: ``acc`` (argmax against the label) or ``rocauc`` (two classes; a node's score is
            ``logit[1] - logit[0]``, monotone in its class-1 probability).

    Shapes:
        - ``logits``: [rows, classes]; ``y`` and every mask: [rows]

    Raises:
        ValueError: an unknown metric, or ``rocauc`` with logits that are not two columns.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    if metric == "acc":
        return accuracies(logits.argmax(dim=1), y, masks, comm)
    if logits.dim() != 2 or logits.shape[1] != 2:
        raise ValueError(f"rocauc needs logits of two classes, got shape {tuple(logits.shape)}")
    score = (logits[:, 1] - logits[:, 0]).detach().cpu()
    labels = y.detach().cpu()
    mine = []
    for name in SPLITS:
        m = masks[name].detach().cpu()
        mine.append((score[m].numpy().astype(np.float64), labels[m].numpy().astype(np.int8)))
    pieces = comm.allgather_object(mine)
    out = {}
    for i, name in enumerate(SPLITS):
        scores = np.concatenate([p[i][0] for p in pieces])
        truth = np.concatenate([p[i][1] for p in pieces])
        out[f"{name}_rocauc"] = roc_auc(truth, scores)
    return out
