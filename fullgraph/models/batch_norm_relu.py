"""BatchNorm over all nodes, then ReLU and the next layer's dropout, in as few passes as possible.

Between two layers ``--norm batch`` computes ``drop(relu(bn(x)))``. Written as three operations
that is about ten passes over an ``N x width`` matrix per step; the graph product that makes
``x`` is only a few, so on a CPU the normalisation would add a third to a GCN epoch. Fused
(CPU, float32, what :class:`BatchNormReluDropout` does):

- forward: one read-only pass for the column sums and sums of squares (float64, shifted by the
  running mean, which every rank holds alike, so nothing large cancels), one all-reduce, and the
  pass that ReLU and dropout cost anyway, now computing ``relu((x - mean) * s + bias)`` with
  the per-column ``s = weight / std`` before the hashed mask;
- backward: the pass ReLU-dropout's backward costs anyway, now also summing ``g`` and
  ``g * (x - mean)`` per column (the bias and weight gradients and the input gradient's
  batch terms), one all-reduce, and one pass ``dx = g * s - a - (x - mean) * b`` in place.

Moments and sums are accumulated per fixed block of rows and the blocks added in order, so the
result does not depend on the thread count. Inside a training step whose block tree is in force
(:func:`~fullgraph.models.norm.norm_tree`) the blocks are the part's node blocks instead (rows
``layout.block_rows[layout.block_ptr[k]:layout.block_ptr[k + 1]]`` for block ``k``, in that
order) and their partials, the row count riding along, are added in the block tree
(:func:`interval_sums`, then
:meth:`~fullgraph.distributed.communicator.Communicator.tree_sum_`): the moments, the running
statistics, the input gradient and the weight and bias gradients (the backward's roots, given
to the tree as they are) are then the same bits at any rank count. Other devices and dtypes
take the composed path (:class:`~fullgraph.models.norm.GraphBatchNorm`, then ReLU and dropout): same
values to rounding, and the same use of the tree.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.distributed.tree_sum import BlockGradients, BlockLayout
from fullgraph.models.dropout import ReluDropout, stream_key, zero_dropped_lanes
from fullgraph.models.norm import GraphBatchNorm, add_global_grads, norm_tree

#: Rows per block of the per-column float64 sums (fixed: the sums do not depend on threads).
BLOCK_ROWS = 2048


@numba.njit(parallel=True, cache=True, nogil=True)
def _column_moments(x, shift, rows, ptr):  # pragma: no cover - JIT
    """Per block of rows (block ``b``: ``rows[ptr[b]:ptr[b + 1]]``, in that order): sum of
    ``x - shift`` and of its square per column, float64."""
    c = x.shape[1]
    nb = len(ptr) - 1
    part = np.zeros((nb, 2, c))
    for b in numba.prange(nb):
        s0 = np.zeros(c)  # block-local sums: the column loop vectorises (same order of adds)
        s1 = np.zeros(c)
        for k in range(ptr[b], ptr[b + 1]):
            row = x[rows[k]]
            for j in range(c):
                d = np.float64(row[j]) - shift[j]
                s0[j] += d
                s1[j] += d * d
        part[b, 0] = s0
        part[b, 1] = s1
    return part


@numba.njit(parallel=True, cache=True, nogil=True)
def _affine_relu_keep(x, m, s, t, gids, key, threshold, scale, out):  # pragma: no cover - JIT
    """out = max((x - m) * s + t, 0) * (scale if kept else 0); masks as dropout's
    ``zero_dropped_lanes``. Centring first keeps a large mean from cancelling in float32. Per
    row: the affine ReLU over the whole row (a loop that vectorises), then the dropped lanes
    zeroed while the row is in cache: the same values as one branchy pass, in about half the
    time."""
    width = x.shape[1]
    zero = np.float32(0.0)
    for i in numba.prange(x.shape[0]):
        xi = x[i]
        oi = out[i]
        for j in range(width):
            v = (xi[j] - m[j]) * s[j] + t[j]
            oi[j] = v * scale if v > 0 else zero
        zero_dropped_lanes(oi, gids[i], key, threshold)


@numba.njit(parallel=True, cache=True, nogil=True)
def _relu_grad_sums(out, grad, scale, x, mean, rows, ptr, res):  # pragma: no cover - JIT
    """res = grad * scale where out > 0 (else 0); per block of rows (as
    :func:`_column_moments`) the column sums of res and of ``res * (x - mean)``, float64.
    ``res`` may be ``grad`` itself: each row is read into a row buffer before it is written,
    and the sums are block-local (both loops vectorise; the adds per column come in the same
    order as one plain loop)."""
    c = x.shape[1]
    nb = len(ptr) - 1
    part = np.zeros((nb, 2, c))
    for b in numba.prange(nb):
        s0 = np.zeros(c)
        s1 = np.zeros(c)
        row = np.empty(c, np.float32)
        for k in range(ptr[b], ptr[b + 1]):
            i = rows[k]
            oi = out[i]
            gi = grad[i]
            xi = x[i]
            for j in range(c):
                g = gi[j] * scale if oi[j] > 0 else np.float32(0.0)
                row[j] = g
                s0[j] += g
                s1[j] += np.float64(g) * (np.float64(xi[j]) - mean[j])
            ri = res[i]
            for j in range(c):
                ri[j] = row[j]
        part[b, 0] = s0
        part[b, 1] = s1
    return part


@numba.njit(parallel=True, cache=True, nogil=True)
def _input_grad(g, x, m, s, a, b):  # pragma: no cover - JIT
    """g = g * s - a - (x - m) * b in place (per-column m, s, a, b)."""
    for i in numba.prange(g.shape[0]):
        for j in range(g.shape[1]):
            g[i, j] = g[i, j] * s[j] - a[j] - (x[i, j] - m[j]) * b[j]


def _use_count(t: torch.Tensor) -> int:
    """References to ``t``'s storage (torch's own count, including the one of this query)."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


#: The count :func:`_use_count` gives for a storage held by one tensor alone (None: torch
#: lacks the private query, so outputs are never reused).
_ALONE = _use_count(torch.empty(1)) if hasattr(torch._C, "_storage_Use_Count") else None


def _output_buffer(norm: GraphBatchNorm, like: torch.Tensor) -> torch.Tensor:
    """The output rows of ``norm``'s fused forward: last step's buffer again when nothing but
    ``norm`` holds it any more (the step's graph is gone), else a new one that ``norm`` keeps.

    A fresh activation-sized buffer costs its page faults and zeroing every step (the output
    of ReLU-dropout without a norm is written in place, so BatchNorm would pay this alone).
    """
    kept = getattr(norm, "_fused_out", None)
    if (
        _ALONE is not None
        and kept is not None
        and kept.shape == like.shape
        and kept.dtype == like.dtype
        and kept.device == like.device
        and _use_count(kept) == _ALONE
    ):
        return kept.detach()  # a new tensor over the same storage, no history
    out = torch.empty_like(like)
    norm._fused_out = out.detach()
    return out


def _blocks_sum(part: np.ndarray) -> np.ndarray:
    """Add the per-block partial sums in block order: [2, width] float64."""
    total = np.zeros(part.shape[1:])
    for blk in part:
        total += blk
    return total


def _row_blocks(n: int, tree: BlockGradients | None) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' blocks of rows ``(rows, ptr)``: the part's node blocks under a block
    tree, else :data:`BLOCK_ROWS` consecutive rows each."""
    if tree is not None:
        return tree.layout.block_rows, tree.layout.block_ptr
    ptr = np.append(np.arange(0, n, BLOCK_ROWS, dtype=np.int64), np.int64(n))
    return np.arange(n, dtype=np.int64), ptr


def interval_sums(layout: BlockLayout, partials: np.ndarray) -> np.ndarray:
    """The sums of the part's tree intervals (``layout.labels``) over per-block partials
    ``partials`` ([blocks, n], the part's blocks in order): what a
    :class:`~fullgraph.distributed.tree_sum.DyadicStack` pushed with them holds (each
    interval's blocks added pairwise level by level, ``left + right``; a left child whose
    right sibling holds no block of the graph kept as is), in a few numpy passes instead of a
    push per block."""
    out = np.empty((len(layout.labels), partials.shape[1]))
    at = 0
    for j, (level, index) in enumerate(layout.labels):
        held = min((index + 1) << level, layout.num_blocks) - (index << level)
        vals = partials[at : at + held]
        at += held
        while len(vals) > 1:
            even = len(vals) // 2 * 2
            pairs = vals[0:even:2] + vals[1:even:2]
            vals = np.concatenate([pairs, vals[even:]]) if even < len(vals) else pairs
        out[j] = vals[0]
    return out


def _tree_sums(
    comm: Any, layout: BlockLayout, part: np.ndarray, key: str, count: bool = False
) -> torch.Tensor:
    """The block tree's root of the per-block partials ``part`` ([blocks, 2, width], the
    layout's blocks in order; ``count``: each block's row count appended), flat, float64."""
    flat = part.reshape(len(part), -1)
    if count:
        rows = np.diff(layout.block_ptr).astype(np.float64)
        flat = np.concatenate([flat, rows[:, None]], axis=1)
    nodes = torch.from_numpy(interval_sums(layout, flat))
    return comm.tree_sum_(nodes, layout.labels, layout.num_blocks, key=key, tag="norm")


class BatchNormReluDropout(torch.autograd.Function):
    """``drop(relu(batch_norm(x)))`` with moments over every rank's rows (CPU, float32)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        norm: GraphBatchNorm,
        comm: Any,
        drop: tuple[np.ndarray, float, int, int, int],
        inplace_grad: bool,
    ) -> torch.Tensor:
        """Normalise with global moments (updating ``norm``'s running statistics), ReLU, drop.

        ``drop`` = (global ids, p, seed, epoch, layer) of the hashed dropout mask;
        ``inplace_grad``: the backward may overwrite the incoming gradient (its one consumer
        made it afresh).
        """
        gids, p, seed, epoch, layer = drop
        xc = x.detach().contiguous()
        shift = norm.running_mean.detach().double().numpy()
        tree = norm_tree(int(x.shape[0]), weight, bias)
        rows, ptr = _row_blocks(int(x.shape[0]), tree)
        part = _column_moments(xc.numpy(), shift, rows, ptr)
        if tree is None:
            local = torch.from_numpy(_blocks_sum(part).reshape(-1))
            sums = torch.cat([local, torch.tensor([float(x.shape[0])], dtype=torch.float64)])
            comm.allreduce_(sums, "sum", tag="norm")
        else:
            sums = _tree_sums(comm, tree.layout, part, "bn-moments", count=True).cpu()
        width, count = x.shape[1], float(sums[-1])
        d_mean = sums[:width] / count
        mean = torch.from_numpy(shift) + d_mean
        var = (sums[width : 2 * width] / count - d_mean * d_mean).clamp_(min=0.0)
        invstd = torch.rsqrt(var + norm.eps)
        s = invstd * weight.detach().double()
        scale = 1.0 / (1.0 - p)
        out = _output_buffer(norm, xc)
        _affine_relu_keep(
            xc.numpy(),
            mean.float().numpy(),
            s.float().numpy(),
            bias.detach().float().numpy(),
            np.ascontiguousarray(gids, dtype=np.int64),
            np.uint64(stream_key(seed, epoch, layer)),
            np.uint64(round(p * 65536)),
            np.float32(scale),
            out.numpy(),
        )
        norm.update_running(mean.float(), var.float(), count)
        ctx.comm, ctx.count, ctx.scale, ctx.inplace = comm, count, scale, inplace_grad
        ctx.tree, ctx.blocks, ctx.bias = tree, (rows, ptr), bias
        ctx.save_for_backward(xc, out, weight)
        ctx.moments = (mean, invstd)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        """ReLU-dropout backward and the two column sums in one pass; all-reduce (or the
        block tree: then the weight and bias gradients go to the tree as its roots); ``dx``."""
        x, out, weight = ctx.saved_tensors
        mean, invstd = ctx.moments
        tree: BlockGradients | None = ctx.tree
        grad = grad.contiguous()
        g = grad if ctx.inplace else torch.empty_like(x)
        part = _relu_grad_sums(
            out.numpy(),
            grad.numpy(),
            np.float32(ctx.scale),
            x.numpy(),
            mean.numpy(),
            *ctx.blocks,
            g.numpy(),
        )
        width = x.shape[1]
        if tree is None:
            local = _blocks_sum(part)  # [sum g, sum g (x - mean)]
            d_bias = torch.from_numpy(local[0])
            d_weight = torch.from_numpy(local[1]) * invstd
            sums = torch.cat([d_bias, d_weight])
            ctx.comm.allreduce_(sums, "sum", tag="norm")
        else:  # the roots of the same sums over every rank's rows
            root = _tree_sums(ctx.comm, tree.layout, part, "bn-grad").cpu()
            d_bias, d_weight = root[:width], root[width:] * invstd
            sums = torch.cat([d_bias, d_weight])
        s_bias, s_weight = sums[:width], sums[width:]
        # dx = s (g - (s_bias + x_hat s_weight) / count), x_hat = (x - mean) invstd, s = w invstd
        s = invstd * weight.detach().double()
        b = s * invstd * s_weight / ctx.count
        a = s * s_bias / ctx.count
        f32 = [v.float().numpy() for v in (mean, s, a, b)]
        _input_grad(g.numpy(), x.numpy(), *f32)
        if tree is not None:  # the roots: the same bits on every rank, not summed again
            add_global_grads(tree, [(weight, d_weight), (ctx.bias, d_bias)])
            return g, None, None, None, None, None, None
        return g, d_weight.float(), d_bias.float(), None, None, None, None


def _evaluate_fused(norm: GraphBatchNorm, x: torch.Tensor) -> torch.Tensor:
    """``relu(norm(x))`` with the running statistics, one pass, into the buffer the training
    steps reuse (evaluation then allocates nothing beside the buffers training keeps)."""
    xc = x.detach().contiguous()
    invstd = torch.rsqrt(norm.running_var.detach().double() + norm.eps)
    s = invstd * norm.weight.detach().double()
    out = _output_buffer(norm, xc)
    _affine_relu_keep(
        xc.numpy(),
        norm.running_mean.detach().float().numpy(),
        s.float().numpy(),
        norm.bias.detach().float().numpy(),
        np.zeros(xc.shape[0], dtype=np.int64),
        np.uint64(0),
        np.uint64(0),  # threshold 0: nothing dropped
        np.float32(1.0),
        out.numpy(),
    )
    return out


def fused_path(x: torch.Tensor) -> bool:
    """Whether :func:`batch_norm_relu_dropout` takes the fused kernels for ``x`` (CPU,
    float32, a matrix), else the composed operations."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2


def batch_norm_relu_dropout(
    norm: GraphBatchNorm,
    x: torch.Tensor,
    comm: Any,
    *,
    global_ids: np.ndarray,
    p: float,
    seed: int,
    epoch: int,
    layer: int,
    training: bool,
    inplace_grad: bool = False,
) -> torch.Tensor:
    """``drop(relu(norm(x)))`` between two layers; fused on CPU float32 in training.

    Args:
        norm: the layer's BatchNorm (running statistics updated in training).
        x: this rank's rows, [num_inner, width].
        comm: the job's communicator (a collective in training: every rank calls it).
        global_ids: global id of every row (keys the dropout mask).
        p: the next layer's dropout probability (0: ReLU only).
        seed, epoch, layer: the dropout stream (``layer`` = the next layer's index).
        training: batch statistics and dropout, else running statistics and ReLU only.
        inplace_grad: the output's gradient comes from one consumer that made it afresh (the
            next layer), so the backward may overwrite it: no activation-sized buffer there.
    """
    fusable = fused_path(x)
    if training and fusable:
        return BatchNormReluDropout.apply(
            x, norm.weight, norm.bias, norm, comm, (global_ids, p, seed, epoch, layer), inplace_grad
        )
    no_grad = not (torch.is_grad_enabled() and (x.requires_grad or norm.weight.requires_grad))
    if not training and not norm.training and fusable and no_grad:
        return _evaluate_fused(norm, x)
    out = norm(x, comm)
    if training and p > 0:
        return ReluDropout.apply(out, global_ids, p, seed, epoch, layer)
    return F.relu(out)
