"""Receptive-field pruning: in training, each layer computes only the rows the loss can reach.

The loss of a step reads the last layer's output at the training nodes only. Layer ``l`` of
``L`` therefore needs its output at the rows ``O_l``:

- ``O_{L-1}`` = the training nodes;
- ``O_{l-1}`` = ``O_l`` and every in-neighbour of a node of ``O_l`` (on any rank),

and nothing else of a layer's output changes the loss or its gradient. :func:`prune_layers`
builds, per layer, the aggregation operator restricted to the rows ``O_l`` and the halo plan
restricted to the halo rows those rows read (the owners learn which of their boundary rows are
still wanted with one all-to-all of flags per layer, at set-up). The restricted operator holds
the same entries of the kept rows in the same order, and the rows it drops carry exactly zero
gradient in the unpruned model too, so the parameters' gradients are the same numbers
(``tests/distributed/test_receptive_field.py`` checks them against the unpruned run).

Rows outside ``O_l`` get the layer's bias (and root term) only: they are not meaningful and
nothing reads them. Evaluation uses the whole operator. Layers whose rows mix with all other
rows (BatchNorm's statistics) or that weigh edges themselves (GAT) are not pruned.

A layer is pruned only where it pays: when the kept rows hold at most ``1 - min_saving`` of the
graph's edges (summed over ranks, so every rank decides alike and the plans of a pair agree);
elsewhere the layer keeps the whole operator and plan (no second copy in memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fullgraph.distributed.halo import HaloPlan, SplitOperator

#: A layer is pruned when that removes at least this share of the graph's edges.
DEFAULT_MIN_SAVING = 0.1


@dataclass
class LayerGraph:
    """The operator and exchange plan one layer trains with, and what pruning kept.

    Attributes:
        op: the (restricted) split operator.
        plan: the (restricted) halo plan.
        rows: output rows kept over all ranks.
        edges: operator entries kept over all ranks.
        total_rows, total_edges: the same of the whole operator.
        halo_rows: halo rows exchanged over all ranks (kept ones when pruned).
        pruned: whether ``op``/``plan`` are restricted (else the whole ones).
    """

    op: SplitOperator
    plan: HaloPlan
    rows: int
    edges: int
    total_rows: int
    total_edges: int
    halo_rows: int
    pruned: bool

    def describe(self, index: int) -> str:
        """One line: what layer ``index`` computes in training."""
        share = self.edges / max(self.total_edges, 1)
        state = "pruned" if self.pruned else "whole (pruning would save too little)"
        return (
            f"layer {index}: {self.rows:,}/{self.total_rows:,} rows, {share:.1%} of the edges, "
            f"{self.halo_rows:,} halo rows exchanged: {state}"
        )


def _edges(op: SplitOperator) -> int:
    """Stored entries of both blocks."""
    return op.inner.nnz + (op.halo.nnz if op.halo is not None else 0)


def _restrict_operator(op: SplitOperator, rows: torch.Tensor, halo_keep: torch.Tensor | None):
    """``op`` with only ``rows`` (bool) kept and its halo columns narrowed to ``halo_keep``."""
    inner = op.inner.select_rows(rows)
    if op.halo is None or halo_keep is None:
        return SplitOperator(inner, None)
    halo = op.halo.select_rows(rows)
    kept = torch.nonzero(halo_keep, as_tuple=True)[0]
    return SplitOperator(inner, halo.select_columns(kept) if kept.numel() else None)


def _wanted_by_peers(plan: HaloPlan, halo_keep: torch.Tensor) -> torch.Tensor:
    """Which of this rank's sent rows (``plan.send_index``) some peer still reads, bool [S].

    Every rank tells each owner, in the owner's send order, which halo rows it keeps.
    """
    comm = plan.comm
    flags = halo_keep.to(torch.uint8).reshape(-1, 1).contiguous()
    got = comm.alltoallv_start(flags, plan.recv_counts, plan.send_counts, tag="setup").wait()
    return got.reshape(-1).to(torch.bool)


def _restrict_plan(plan: HaloPlan, send_keep: torch.Tensor, halo_keep: torch.Tensor) -> HaloPlan:
    """``plan`` sending only ``send_keep`` rows and receiving only ``halo_keep`` rows
    (a collective: the largest exchange is agreed on by all-reduce)."""

    def per_peer(keep: torch.Tensor, counts: list[int]) -> list[int]:
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        kept = np.concatenate([[0], np.cumsum(keep.numpy().astype(np.int64))])
        return [int(kept[b] - kept[a]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    send_counts = per_peer(send_keep, plan.send_counts)
    recv_counts = per_peer(halo_keep, plan.recv_counts)
    local = torch.tensor([float(max(sum(send_counts), sum(recv_counts)))], dtype=torch.float64)
    gids = plan.global_ids
    if gids is not None:  # the kept halo rows keep their global ids (the order of the sums)
        gids = torch.cat([gids[: plan.num_inner], gids[plan.num_inner :][halo_keep]])
    return HaloPlan(
        comm=plan.comm,
        send_index=plan.send_index[send_keep],
        send_counts=send_counts,
        recv_counts=recv_counts,
        num_inner=plan.num_inner,
        num_halo=int(halo_keep.sum()),
        overlap=plan.overlap,
        compression=plan.compression,
        max_rows=int(plan.comm.allreduce_(local, "max", tag="setup")[0]),
        buffer_bytes=plan.buffer_bytes,
        precision=plan.precision,
        global_ids=gids,
    )


def prune_layers(
    op: SplitOperator,
    plan: HaloPlan,
    train_mask: torch.Tensor,
    num_layers: int,
    *,
    min_saving: float = DEFAULT_MIN_SAVING,
) -> list[LayerGraph]:
    """Per layer (first to last), the operator and plan that layer trains with.

    A collective: every rank calls it with its own operator, plan and training mask.

    Args:
        op: the whole split operator (rows = inner nodes).
        plan: the whole halo plan.
        train_mask: bool [num_inner], the training nodes of this rank.
        num_layers: layers of the model.
        min_saving: prune a layer only when that removes at least this share of the edges.

    Returns:
        ``num_layers`` :class:`LayerGraph` s, index = layer.
    """
    comm = plan.comm
    n = plan.num_inner
    wanted = train_mask.to(torch.bool).cpu().clone()
    if wanted.shape != (n,):
        raise ValueError(f"prune_layers: training mask of {tuple(wanted.shape)} for {n} rows")
    whole = torch.tensor([float(n), float(_edges(op)), float(plan.num_halo)], dtype=torch.float64)
    whole = comm.allreduce_(whole, "sum", tag="setup")
    total_rows, total_edges, total_halo = (int(v) for v in whole.tolist())
    device = op.inner.device
    out: list[LayerGraph] = []
    for _ in range(num_layers):  # last layer first
        # the entries of the wanted rows: their columns (no operator is built unless pruned)
        inner_cols = op.inner.indices[op.inner.entries_of_rows(wanted)].to(torch.int64).cpu()
        halo_keep = torch.zeros(plan.num_halo, dtype=torch.bool)
        halo_edges = 0
        if op.halo is not None:
            halo_cols = op.halo.indices[op.halo.entries_of_rows(wanted)].to(torch.int64).cpu()
            halo_keep[halo_cols] = True
            halo_edges = int(halo_cols.numel())
            del halo_cols
        counts = torch.tensor(
            [float(wanted.sum()), float(inner_cols.numel() + halo_edges), float(halo_keep.sum())],
            dtype=torch.float64,
        )
        counts = comm.allreduce_(counts, "sum", tag="setup")
        rows, edges, halo_rows = (int(v) for v in counts.tolist())
        send_keep = _wanted_by_peers(plan, halo_keep) if comm.size > 1 else None
        if edges <= (1.0 - min_saving) * total_edges:
            layer_op = _restrict_operator(op, wanted.to(device), halo_keep)
            layer_plan = plan if send_keep is None else _restrict_plan(plan, send_keep, halo_keep)
            graph = LayerGraph(
                layer_op, layer_plan, rows, edges, total_rows, total_edges, halo_rows, True
            )
        else:
            graph = LayerGraph(op, plan, rows, edges, total_rows, total_edges, total_halo, False)
        out.append(graph)
        # the rows the next layer down must produce: these rows, their inner neighbours, and
        # the boundary rows some peer reads
        below = wanted.clone()
        below[inner_cols] = True
        if send_keep is not None:
            below[plan.send_index[send_keep]] = True
        wanted = below
        del inner_cols
    out.reverse()
    return out
