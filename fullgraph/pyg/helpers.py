"""The calls of a training script that must see every rank: loss, accuracy, dropout.

- :func:`loss`: cross-entropy summed over this rank's training nodes and divided by the GLOBAL
  training count, so the ranks' gradients add up to the one-process gradient; its value is
  the global loss on every rank.
- :func:`accuracy`: correct predictions over all ranks.
- :func:`dropout`: ``F.dropout`` with masks hashed from (seed, step, call index, global node
  id, column): the masks one process draws, whichever rank holds a node (inside a converted
  model ``F.dropout`` draws them too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fullgraph.pyg.functional import drop
from fullgraph.pyg.node_reductions import GlobalValue, exact_sum
from fullgraph.pyg.node_rows import plain
from fullgraph.pyg.part_data import part_graph_of
from fullgraph.pyg.runtime import active_part

if TYPE_CHECKING:
    from torch_geometric.data import Data


def loss(out: torch.Tensor, data: Data, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of the nodes of ``mask`` over all ranks (a collective).

    ``F.cross_entropy(out[mask], y[mask])`` of one process: this rank's nodes are summed and
    divided by the number of ``mask`` nodes on all ranks, so that the gradients the model sums
    over the ranks at the end of ``backward()`` are the one-process gradient.

    Args:
        out: logits of this rank's nodes, [num_nodes, classes].
        data: this rank's part (:func:`fullgraph.pyg.load_part`).
        mask: the nodes the loss is taken over (default ``data.train_mask``).

    Returns:
        A 0-d tensor: the global loss on every rank; its gradient is this rank's share.
    """
    part = part_graph_of(data, "fullgraph.pyg.loss")
    out, y = plain(out), plain(data.y)  # this rank's rows: the sums below are the global ones
    mask = plain(data.train_mask if mask is None else mask)
    per = F.cross_entropy(out[mask], y[mask], reduction="none")
    total = per.sum()
    exact = exact_sum(part, per)  # the value: the same bits at any rank count
    local = total.detach().double().cpu() if exact is None else torch.zeros((), dtype=torch.float64)
    sums = torch.stack([local, mask.sum().double().cpu()])
    sums = part.comm.allreduce_(sums, "sum", tag="metrics")
    count = max(float(sums[1]), 1.0)
    share = total / count
    summed = sums[0] if exact is None else exact
    value = (summed / count).to(dtype=share.dtype, device=share.device)
    return GlobalValue.apply(share, value)


def accuracy(out: torch.Tensor, data: Data, mask: torch.Tensor) -> float:
    """Share of the nodes of ``mask`` on all ranks whose prediction is right (a collective).

    Args:
        out: logits [num_nodes, classes] or predicted classes [num_nodes] of this rank's nodes.
        data: this rank's part (:func:`fullgraph.pyg.load_part`).
        mask: the nodes counted (``data.val_mask``, ...).

    Returns:
        Correct over counted nodes of the whole graph (0.0 when none is counted).
    """
    part = part_graph_of(data, "fullgraph.pyg.accuracy")
    out, y, mask = plain(out), plain(data.y), plain(mask)
    pred = out.argmax(dim=-1) if out.dim() > 1 else out
    correct = (pred[mask] == y[mask]).sum()
    counts = torch.stack([correct.double().cpu(), mask.sum().double().cpu()])
    counts = part.comm.allreduce_(counts, "sum", tag="metrics")
    return float(counts[0] / counts[1]) if float(counts[1]) > 0 else 0.0


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    """``F.dropout`` for the forward pass of a converted model, exact across ranks.

    Inside the forward pass of a model converted by :func:`fullgraph.pyg.distribute`, the mask
    of node ``v``, column ``j`` is a hash of (seed, training step, index of this dropout call in
    the pass, ``v``'s global id, ``j``): P ranks draw what one process draws. Anywhere else
    (the unconverted model) this is ``F.dropout``, so a model may call it in both settings.
    ``F.dropout`` itself draws the same masks inside a converted model
    (:mod:`fullgraph.pyg.functional`); this is the same call by name.

    Args:
        x: node rows, [num_nodes, width].
        p: drop probability, ``0 <= p < 1``.
        training: drop (else ``x`` is returned unchanged).

    Returns:
        ``x * mask / (1 - p)``.

    Raises:
        ConfigError: inside a converted model, ``x`` is neither one row per node of the part
            nor a parameter.
    """
    part = active_part()
    if part is None:
        return F.dropout(x, p, training)
    return drop(part, x, p, training, "fullgraph.pyg.dropout")
