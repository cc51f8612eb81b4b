"""The maximum over in-neighbours (``aggr="max"``) with a gradient of the same bits at every
rank count (issue 33).

The forward is :func:`~fullgraph.kernels.segment_max` over ``[h; halo]`` (ties to the lowest
global id: every rank picks one process's neighbour). A source row's gradient is the sum of the
output gradients of every row that picked it, on any rank; :class:`HaloMax` sums them in
ascending global id of the picking row, in one pass
(:func:`~fullgraph.kernels.segment_max.route_max_gradient_ordered_`), through the
:class:`~fullgraph.distributed.ordered.ReversePlan` of the edge structure: each rank sends the
gradient rows of its boundary rows with the global id each output picked, and the owners add
those of the rows that picked theirs. Before, each rank added its rows' gradients in local row
order and the owners added the returned halo gradients in rank order.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from fullgraph.distributed import exchange_slices as slicing
from fullgraph.distributed.halo import HaloPlan
from fullgraph.distributed.split_operator import SplitOperator
from fullgraph.kernels import CSRMatrix
from fullgraph.kernels.backend import numba_or_torch
from fullgraph.kernels.segment_max import (
    route_max_gradient_ordered_,
    segment_max_numba,
    segment_max_torch,
)

#: structure -> (its column split on the CPU, the global ids it is ordered by), while it lives
_SPLITS: weakref.WeakKeyDictionary[CSRMatrix, tuple[SplitOperator, torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


def structure_operator(
    structure: CSRMatrix, num_inner: int, global_ids: np.ndarray | torch.Tensor
) -> tuple[SplitOperator, torch.Tensor]:
    """The edge structure split into inner and halo columns on the CPU, and the global ids
    (int64 tensor) of its columns; built once per structure."""
    held = _SPLITS.get(structure)
    if held is None:
        cpu = structure.to("cpu")
        inner = cpu.select_columns(torch.arange(num_inner))
        halo = None
        if cpu.num_cols > num_inner:
            halo = cpu.select_columns(torch.arange(num_inner, cpu.num_cols))
        # a copy: a memory-mapped partition's ids are read-only (torch warns on a view of them)
        gids = torch.from_numpy(np.array(global_ids, dtype=np.int64))
        held = _SPLITS[structure] = (SplitOperator(inner, halo), gids)
    return held


class HaloMax(torch.autograd.Function):
    """``out[i, f] = max_{j -> i} h[j, f]`` over inner and halo rows, its gradient summed in
    ascending global id of the rows that picked a source (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        h: torch.Tensor,
        structure: CSRMatrix,
        plan: HaloPlan,
        global_ids: np.ndarray | torch.Tensor,
    ) -> torch.Tensor:
        """The maxima, float [num_inner, W] (0 for a row without in-neighbours).

        Args:
            h: the inner rows, float32 or float64 [num_inner, W].
            structure: rows = inner nodes, columns = local ids (inner, then halo).
            plan: the exchange plan.
            global_ids: global id of every local node, int64 [num_inner + num_halo].
        """
        n = int(h.shape[0])
        op, gids = structure_operator(structure, n, global_ids)
        rows = h.detach()
        if plan.comm.size > 1:
            rows = torch.cat([rows, plan.start_forward(rows).wait().to(h.dtype)])
        key = gids.to(h.device)
        backend = numba_or_torch(h.device, h.dtype, "segment_max")
        run = segment_max_numba if backend == "numba" else segment_max_torch
        out, arg = run(structure, rows, key, torch.int64)
        arg_key = torch.where(arg >= 0, key[arg.clamp(min=0)], -1)
        ctx.save_for_backward(arg_key)
        ctx.op, ctx.plan, ctx.gids = op, plan, gids
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        """Every source row's gradient, summed in ascending global id of the picking rows."""
        (arg_key,) = ctx.saved_tensors
        op: SplitOperator = ctx.op
        plan: HaloPlan = ctx.plan
        device = grad.device
        grad = grad.detach().to("cpu").contiguous()
        arg_key = arg_key.to("cpu").contiguous()
        n, width = int(grad.shape[0]), int(grad.shape[1])
        rev = op.reverse(plan.comm, plan.send_index, plan.send_counts, plan.recv_counts, ctx.gids)
        split = rev.split
        row_key = ctx.gids[:n].contiguous()
        out = torch.empty((n, width), dtype=grad.dtype)

        def interior() -> None:
            route_max_gradient_ordered_(
                out, split.interior, split.interior_rows, row_key, grad, arg_key
            )

        halo = halo_arg = None
        if plan.comm.size == 1:
            interior()
        else:

            def start(piece: slicing.ExchangeSlice | None) -> slicing.Pending:
                index, sent, got = (
                    (rev.send_index, rev.send_counts, rev.recv_counts)
                    if piece is None
                    else (piece.send_index, piece.send_counts, piece.recv_counts)
                )
                rows = torch.cat([grad[index].double(), arg_key[index].double()], dim=1)
                pending = plan.comm.alltoallv_start(rows, sent, got, tag="halo")
                if not plan.overlap:
                    pending.wait()
                return pending

            # float64 rows of 2W columns: the slices of a 4W-column float32 exchange
            pieces = rev.slices(4 * width, plan.buffer_bytes)
            landed = slicing.land(start, pieces, sum(rev.recv_counts), interior)
            halo, halo_arg = landed[:, :width].to(grad.dtype), landed[:, width:].to(torch.int64)
        route_max_gradient_ordered_(
            out, split.boundary, split.boundary_rows, row_key, grad, arg_key, halo, halo_arg
        )
        return out.to(device), None, None, None
