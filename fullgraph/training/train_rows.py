"""Training steps on the loss's rows alone, for stacks whose every layer works per row.

An MLP, SGC and SIGN (after their hops, computed once) have no operator: a row's logits are a
function of that row's input alone, so the loss of a step, which reads the training rows,
reads nothing else. With ``--prune auto`` (the default, the receptive-field pruning of the
message-passing kinds, :mod:`fullgraph.distributed.receptive_field`) such a step runs on the
training rows of each rank alone: their input rows (the features, or the precomputed hops)
copied out once, and the part's blocks restricted to them
(:meth:`~fullgraph.distributed.tree_sum.BlockLayout.restricted`). On products-synth 8% of the
rows are training rows, so a SIGN step does about a twelfth of the products.

Exactness: which rows of a block are kept depends on the nodes alone, the dropout masks on the
node ids (:mod:`fullgraph.models.dropout`), so the per-block partial sums and the tree over
them are the same bits at any rank count and equal to one process with the same option. They
are not the bits of ``--prune off``: a block's partial over fewer rows rounds otherwise (the
same numbers to float rounding). Evaluation and prediction always run on every row.
Not restricted: BatchNorm (its statistics are over every row), ``--sums rank-order`` without
blocks (nothing to restrict; the rows still shrink), sparse input rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fullgraph.models.context import GraphContext
from fullgraph.training.config import TrainConfig


@dataclass
class TrainRows:
    """What a training step reads when it runs on the training rows alone.

    Attributes:
        ctx: the rank's context restricted to those rows (ids, precomputed hops, blocks).
        x: their input features.
        y: their labels.
        rows: their local inner rows, ascending (int64).
    """

    ctx: GraphContext
    x: torch.Tensor
    y: torch.Tensor
    rows: torch.Tensor

    @property
    def mask(self) -> torch.Tensor:
        """Every row of the step is a training row."""
        return torch.ones(self.rows.shape[0], dtype=torch.bool, device=self.rows.device)


def restricts_stack(model: nn.Module, config: TrainConfig) -> bool:
    """Whether ``config`` trains ``model`` on the training rows alone given dense input:
    ``--prune auto``, every layer per row (:attr:`~fullgraph.models.layers.GraphLayer.
    per_row`), no BatchNorm (the memory model asks this of its meta-device model)."""
    layers = getattr(model, "layers", None)
    return (
        config.prune == "auto"
        and config.norm != "batch"
        and config.task != "link"
        and layers is not None
        and len(layers) > 0
        and all(getattr(layer, "per_row", False) for layer in layers)
    )


def restricts(model: nn.Module, config: TrainConfig, ctx: GraphContext) -> bool:
    """Whether training steps run on the training rows alone: :func:`restricts_stack`, and
    the rank's input rows are dense."""
    return ctx.sparse_x is None and restricts_stack(model, config)


def train_rows(
    model: nn.Module, config: TrainConfig, ctx: GraphContext, data: dict[str, torch.Tensor]
) -> TrainRows | None:
    """The training rows' step inputs (:class:`TrainRows`), or ``None`` where the step runs
    on every row (:func:`restricts` says no)."""
    if not restricts(model, config, ctx):
        return None
    mask = data["train"]
    rows = torch.nonzero(mask, as_tuple=False).reshape(-1)
    keep = rows.cpu().numpy().astype(np.int64)

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, rows)

    def pick_ids(ids: np.ndarray | None) -> np.ndarray | None:
        return None if ids is None else np.ascontiguousarray(ids[keep])

    sub = dataclasses.replace(
        ctx,
        global_ids=pick_ids(ctx.global_ids),
        first_aggregate=pick(ctx.first_aggregate),
        whole_ids=pick_ids(ctx.whole_ids),
        local_global_ids=None,
        structure=None,
        train_graphs=None,
        blocks=None if ctx.blocks is None else ctx.blocks.restricted(keep),
    )
    return TrainRows(ctx=sub, x=pick(data["x"]), y=pick(data["y"]), rows=rows)
