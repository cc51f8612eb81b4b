"""What every layer of a rank needs besides its input: operator, exchange plan, dropout ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fullgraph.distributed.halo import HaloAggregate, HaloPlan, SplitOperator
from fullgraph.distributed.ordered_max import HaloMax
from fullgraph.distributed.receptive_field import LayerGraph
from fullgraph.distributed.tree_sum import BlockLayout
from fullgraph.kernels import CSRMatrix
from fullgraph.precision import Precision


@dataclass
class GraphContext:
    """Per-rank data every forward pass needs.

    Attributes:
        op: the split aggregation operator of the model.
        plan: the halo exchange plan.
        global_ids: global id of every inner node, int64 [num_inner] (its output row).
        seed: the run's seed (dropout streams).
        first_aggregate: precomputed aggregation of the input features, or ``None``.
        sparse_x: the input features as a CSR matrix when they are sparse (the first layer
            then drops and multiplies only the stored entries), or ``None``.
        structure: the part's local CSR of incoming edges without values (rows = inner nodes,
            columns = local ids: inner first, then halo), for layers that read the edges
            themselves (attention, the maximum over neighbours); ``None`` when no layer needs it.
        local_global_ids: global id of every local node (inner, then halo), int64
            [num_inner + num_halo]; keys per-edge random draws and breaks the maximum's ties.
        train_graphs: per layer, the operator and plan restricted to the rows the training
            loss reaches (:mod:`fullgraph.distributed.receptive_field`), or ``None``: every
            layer trains on the whole ones.
        blocks: the part's fixed node blocks (:class:`~fullgraph.distributed.tree_sum.
            BlockLayout`): the trainer then sums weight and bias gradients and the loss over
            them in one fixed tree, the same bits at any rank count; ``None`` for a partition
            written before blocks (sums in rank order, as before).
        whole_ids: a receptive-field cut's ids of the inner nodes in the whole graph (int64
            [num_inner]; :mod:`~fullgraph.partition.receptive_cut`), or ``None``: the global
            ids. :attr:`stream_ids` keys the dropout streams with them.
    """

    op: SplitOperator
    plan: HaloPlan
    global_ids: np.ndarray
    seed: int
    first_aggregate: torch.Tensor | None = None
    sparse_x: CSRMatrix | None = None
    structure: CSRMatrix | None = None
    local_global_ids: np.ndarray | None = None
    train_graphs: list[LayerGraph] | None = None
    blocks: BlockLayout | None = None
    whole_ids: np.ndarray | None = None

    @property
    def stream_ids(self) -> np.ndarray:
        """The ids that key every inner node's dropout stream: its id in the whole graph."""
        return self.global_ids if self.whole_ids is None else self.whole_ids

    @property
    def precision(self) -> Precision:
        """The run's precision policy, as the halo plan was built with."""
        return self.plan.precision

    def plans(self) -> list[HaloPlan]:
        """Every distinct halo plan the layers use (the whole one first, then pruned ones):
        what a caller changing ``overlap`` or ``compression`` must change alike."""
        out = [self.plan]
        for graph in self.train_graphs or []:
            if all(graph.plan is not p for p in out):
                out.append(graph.plan)
        return out

    def layer_graph(self, index: int, training: bool) -> tuple[SplitOperator, HaloPlan]:
        """The operator and plan layer ``index`` runs on: pruned in training when built."""
        if training and self.train_graphs is not None:
            graph = self.train_graphs[index]
            return graph.op, graph.plan
        return self.op, self.plan

    def aggregate(self, h: torch.Tensor) -> torch.Tensor:
        """``A_inner @ h + A_halo @ halo(h)``, differentiable, exchange overlapped."""
        return HaloAggregate.apply(h, self.op, self.plan)

    def aggregate_max(self, h: torch.Tensor) -> torch.Tensor:
        """The maximum of ``h`` over every inner node's incoming neighbours, per column (0 for
        a node without any), differentiable.

        :class:`~fullgraph.distributed.ordered_max.HaloMax`: the halo rows of ``h`` come from
        their owners, the maxima tie to the lowest global id (:attr:`local_global_ids`), so
        every gradient goes to the neighbour one process would pick, and the gradient of a
        source picked by several rows is summed in ascending global id of those rows, on its
        owner (the same bits at every rank count).

        Raises:
            ValueError: the context was built without the edge structure (the layer kind's
                stack must be one that needs it, ``needs_structure``).
        """
        if self.structure is None or self.local_global_ids is None:
            raise ValueError("aggregate_max: the context holds no edge structure")
        return HaloMax.apply(h, self.structure, self.plan, self.local_global_ids)
