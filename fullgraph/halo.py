"""Halo exchange: fill halo rows from their owners, return halo gradients to them.

Each rank's local rows are its inner nodes followed by halo nodes grouped by owner rank. For
peer ``q`` the rank sends ``h[send_index[send_offsets[q]:send_offsets[q+1]]]`` and receives the
halo rows ``recv_offsets[q]:recv_offsets[q+1]`` (in the order ``q`` sends them).

- :class:`HaloExchange` (autograd): forward returns the halo rows; backward sends the halo-row
  gradients back to their owners, who sum them into their inner rows with ``index_add``.
- :class:`HaloAggregate` (autograd): ``Y = A_inner @ H + A_halo @ H_halo`` with the exchange in
  flight while ``A_inner @ H`` runs, and the reverse exchange in flight while ``A_inner^T @ dY``
  runs in the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fullgraph.comm import Communicator, PendingExchange
from fullgraph.kernels import CSRMatrix, spmm


@dataclass
class HaloPlan:
    """Who sends which rows to whom; built once per partition.

    Attributes:
        comm: the communicator.
        send_index: local inner ids sent, grouped by destination rank, int64 [S].
        send_counts: rows sent to each rank, list of P ints.
        recv_counts: halo rows received from each rank, list of P ints.
        num_inner: inner rows of this rank.
        num_halo: halo rows of this rank.
        overlap: run the inner aggregation while the exchange is in flight (``False`` waits
            first; benchmarks use it to measure what the overlap hides).
    """

    comm: Communicator
    send_index: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    num_inner: int
    num_halo: int
    overlap: bool = True

    @classmethod
    def from_partition(cls, part: Any, comm: Communicator) -> HaloPlan:
        """Build the plan from a partition's ``send_index``/``send_offsets``/``recv_offsets``."""
        return cls(
            comm=comm,
            send_index=torch.from_numpy(np.array(part.send_index, dtype=np.int64)),
            send_counts=np.diff(np.asarray(part.send_offsets)).astype(int).tolist(),
            recv_counts=np.diff(np.asarray(part.recv_offsets)).astype(int).tolist(),
            num_inner=int(part.num_inner),
            num_halo=int(part.num_halo),
        )

    def start_forward(self, h_inner: torch.Tensor) -> PendingExchange:
        """Send boundary rows of ``h_inner``; the result's ``wait()`` gives the halo rows."""
        send = h_inner.index_select(0, self.send_index.to(h_inner.device))
        return self.comm.alltoallv_start(send, self.send_counts, self.recv_counts, tag="halo")

    def start_backward(self, grad_halo: torch.Tensor) -> PendingExchange:
        """Send halo-row gradients back to their owners; ``wait()`` gives rows to sum."""
        return self.comm.alltoallv_start(grad_halo, self.recv_counts, self.send_counts, tag="halo")

    def scatter_back(self, grad_inner: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        """Sum received halo gradients into their owners' rows (``index_add_``)."""
        if received.shape[0]:
            grad_inner.index_add_(0, self.send_index.to(grad_inner.device), received)
        return grad_inner


class HaloExchange(torch.autograd.Function):
    """Autograd halo exchange: ``H_inner -> H_halo`` (blocking; see :class:`HaloAggregate`)."""

    @staticmethod
    def forward(ctx: Any, h_inner: torch.Tensor, plan: HaloPlan) -> torch.Tensor:
        """Return the halo rows, float [num_halo, W], received from their owners."""
        ctx.plan = plan
        ctx.num_inner = h_inner.shape[0]
        return plan.start_forward(h_inner).wait()

    @staticmethod
    def backward(ctx: Any, grad_halo: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Send halo gradients to their owners; owners sum them into inner-row gradients."""
        plan: HaloPlan = ctx.plan
        received = plan.start_backward(grad_halo.contiguous()).wait()
        grad = grad_halo.new_zeros((ctx.num_inner, grad_halo.shape[1]))
        return plan.scatter_back(grad, received), None


@dataclass
class SplitOperator:
    """A local aggregation operator split by column block, with transposes for backward.

    Attributes:
        inner: rows = inner nodes, columns = inner nodes.
        halo: rows = inner nodes, columns = halo nodes (``None`` without halo).
    """

    inner: CSRMatrix
    halo: CSRMatrix | None

    def __post_init__(self) -> None:
        self.inner_t = self.inner.t()
        self.halo_t = self.halo.t() if self.halo is not None else None


class HaloAggregate(torch.autograd.Function):
    """``Y = A_inner @ H + A_halo @ halo(H)``, overlapping the exchange with the inner part."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, op: SplitOperator, plan: HaloPlan) -> torch.Tensor:
        """Aggregate over inner and halo neighbours.

        Shapes:
            - ``h``: [num_inner, W] -> [num_inner, W].
        """
        ctx.op, ctx.plan = op, plan
        pending = plan.start_forward(h) if plan.comm.size > 1 else None
        if pending is not None and not plan.overlap:
            pending.wait()
        y = spmm(op.inner, h)
        if pending is not None:
            halo = pending.wait()
            if op.halo is not None and halo.shape[0]:
                y = y + spmm(op.halo, halo)
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        """Send ``A_halo^T dY`` to the owners while ``A_inner^T dY`` runs; owners sum."""
        op: SplitOperator = ctx.op
        plan: HaloPlan = ctx.plan
        grad_y = grad_y.contiguous()
        pending = None
        if plan.comm.size > 1:
            if op.halo_t is not None:
                grad_halo = spmm(op.halo_t, grad_y)
            else:
                grad_halo = grad_y.new_zeros((0, grad_y.shape[1]))
            pending = plan.start_backward(grad_halo)
            if not plan.overlap:
                pending.wait()
        grad_h = spmm(op.inner_t, grad_y)
        if pending is not None:
            grad_h = plan.scatter_back(grad_h, pending.wait())
        return grad_h, None, None
