"""Graph attention whose gradients are the same bits at every rank count (issue 33).

:class:`OrderedAttention` is :class:`~fullgraph.kernels.edge_attention.EdgeAttention` for a
training step with the block tree (:mod:`fullgraph.distributed.tree_sum`). Its input is the
INNER rows' extended projection ``[xp | asrc | adst]`` only (the block tree takes the weight's
gradient over exactly these rows); the halo rows' ``[xp | asrc]`` come from their owners
without autograd, so no halo gradient goes back to be added on the owner in rank order.
Instead, the owner of a source ``j`` sums every term of ``j``'s gradient itself, over its
self-loop and then all its destinations in ascending global id
(:mod:`fullgraph.kernels.edge_attention_ordered`):

1. every rank computes, on its inner rows ``i`` (their in-edges are all local), ``dot_sum_i``
   and the destination terms' gradient (one row pass in the graph's order: ascending global
   id of the source, :class:`~fullgraph.kernels.attention_graph.AttentionGraph`);
2. it sends, through the :class:`~fullgraph.distributed.ordered.ReversePlan` of the edge
   structure (the plan ``--aggr max`` uses), the rows ``[dOut_i | adst_i | rmax_i | rden_i |
   dot_sum_i]`` of its rows ``i`` that read a source another rank owns, to that owner
   (``heads * (width + 4)`` float32 columns a row, once per backward pass);
3. every owner adds, per source ``j``, its edges' terms from those rows and its own.

Every term is computed from the same values at every rank count and added in the same order:
one process (the reverse plan of one rank) gives the same bits. The backward runs on the CPU
(numba), like the ordered maximum's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fullgraph.distributed.halo import HaloPlan
from fullgraph.distributed.ordered import ReversePlan
from fullgraph.distributed.ordered_max import structure_operator
from fullgraph.kernels import CSRMatrix
from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.backend import numba_or_torch
from fullgraph.kernels.edge_attention_cpu import attention_forward_numba
from fullgraph.kernels.edge_attention_ordered import (
    attention_columns_ordered,
    attention_rows_ordered,
    destination_rows,
)
from fullgraph.kernels.edge_attention_torch import attention_forward_torch

#: The attribute of a ReversePlan holding the global ids of the rows it receives.
_IDS_AS = "_received_global_ids"


def received_ids(rev: ReversePlan, plan: HaloPlan, inner_ids: torch.Tensor) -> np.ndarray:
    """The global ids of the rows ``rev`` receives, in their order (an all-to-all of float64
    ids, exact below 2^53, on the first call for ``rev``: a collective; kept on ``rev``)."""
    held = getattr(rev, _IDS_AS, None)
    if held is None:
        ids = inner_ids.index_select(0, rev.send_index).double().reshape(-1, 1)
        got = plan.comm.alltoallv_start(ids, rev.send_counts, rev.recv_counts, tag="setup")
        held = got.wait().reshape(-1).to(torch.int64).numpy()
        setattr(rev, _IDS_AS, held)
    return held


class OrderedAttention(torch.autograd.Function):
    """The attention aggregation of the inner rows, its backward summed in a fixed order."""

    @staticmethod
    def forward(
        ctx: Any,
        inner: torch.Tensor,
        halo: torch.Tensor | None,
        graph: AttentionGraph,
        structure: CSRMatrix,
        plan: HaloPlan,
        global_ids: np.ndarray,
        heads: int,
        width: int,
        keys: np.ndarray | None,
        p: float,
        slope: float,
    ) -> torch.Tensor:
        """``sum_j alpha_ij keep_ij / (1 - p) xp_j`` per head, [num_inner, heads * width].

        Args:
            inner: the inner rows' ``[xp | asrc | adst]``, [num_inner, heads * (width + 2)].
            halo: the halo rows' ``[xp | asrc]`` (no gradient), or ``None`` (one rank).
            graph: the rank's attention graph (rows ascending in global id of the source).
            structure: the edge structure ``graph`` was built from (its reverse plan).
            plan: the halo plan.
            global_ids: global id of every local node (inner, then halo).
            heads, width, keys, p, slope: as :func:`~fullgraph.kernels.edge_attention.
                edge_attention`.
        """
        sent = heads * (width + 1)
        if inner.shape[1] != heads * (width + 2):
            raise ValueError(f"inner rows {tuple(inner.shape)}: need {heads * (width + 2)} columns")
        rows = inner[:, :sent] if halo is None else torch.cat([inner[:, :sent], halo])
        rows = rows.detach().contiguous()
        adst = inner[:, sent:].detach().contiguous()
        backend = numba_or_torch(rows.device, rows.dtype, "edge_attention")
        run = attention_forward_numba if backend == "numba" else attention_forward_torch
        out, rmax, rden = run(graph, rows, adst, width, keys, p, slope)
        ctx.save_for_backward(rows, adst, rmax, rden)
        ctx.graph, ctx.structure, ctx.plan, ctx.global_ids = graph, structure, plan, global_ids
        ctx.heads, ctx.width, ctx.keys, ctx.p, ctx.slope = heads, width, keys, p, slope
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        """The inner rows' gradient ``[grad_xp | grad_asrc | grad_adst]``; none for the halo."""
        rows, adst, rmax, rden = (t.detach().cpu() for t in ctx.saved_tensors)
        graph: AttentionGraph = ctx.graph
        plan: HaloPlan = ctx.plan
        heads, width, keys, p, slope = ctx.heads, ctx.width, ctx.keys, ctx.p, ctx.slope
        device = grad.device
        g = grad.detach().to("cpu", rows.dtype).contiguous()
        n, hc = graph.num_inner, heads * width
        dot_sum, grad_adst = attention_rows_ordered(
            graph, rows, adst, width, rmax, rden, g, keys, p, slope
        )
        dest = destination_rows(g, adst, rmax, rden, dot_sum)
        op, gids = structure_operator(ctx.structure, n, ctx.global_ids)
        rev = op.reverse(plan.comm, plan.send_index, plan.send_counts, plan.recv_counts, gids)
        inner_ids = gids[:n].contiguous()
        dest_ids = inner_ids.numpy()
        if plan.comm.size > 1:
            sent = dest.index_select(0, rev.send_index)
            got = plan.comm.alltoallv_start(sent, rev.send_counts, rev.recv_counts, tag="halo")
            dest = torch.cat([dest, got.wait().to(dest.dtype)])
            dest_ids = np.concatenate([dest_ids, received_ids(rev, plan, inner_ids)])
        out = torch.empty((n, heads * (width + 2)), dtype=rows.dtype)
        xp = rows[:n].contiguous()
        ids = inner_ids.numpy()
        for split_rows, split in (
            (rev.split.interior_rows, rev.split.interior),
            (rev.split.boundary_rows, rev.split.boundary),
        ):
            attention_columns_ordered(
                split_rows, split, ids, dest_ids, xp, dest, heads, width, keys, p, slope, out
            )
        out[:, hc + heads :] = grad_adst
        return out.to(device), None, None, None, None, None, None, None, None, None, None
