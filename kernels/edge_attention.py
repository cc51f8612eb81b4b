"""Graph attention over a rank's in-edges: per-row edge softmax, attention dropout, weighted sum.

For every inner node ``i`` and head ``h``, over its in-neighbours ``j`` plus ``i`` itself (the
self-loop GAT adds)::

    s_ij   = LeakyReLU(a_src[j, h] + a_dst[i, h])
    alpha  = softmax_j(s_ij)                         (max subtracted, as PyG)
    out_i  = sum_j alpha_ij * keep_ij / (1 - p) * xp[j, h, :]

``keep_ij`` is the attention-dropout mask
(:func:`~fullgraph.kernels.attention_dropout.attention_keep`): a counter hash of the edge's
GLOBAL endpoint ids under a key of ``(seed, epoch, layer, word)``, so one process and P ranks
drop the same edges. The edges are an :class:`~fullgraph.kernels.attention_graph.AttentionGraph`.

:class:`EdgeAttention` is the autograd function. Its forward keeps only node-level tensors for
the backward (the projected rows, the source and destination terms, and every row's maximum and
softmax denominator, ``[rows, heads]``); the backward recomputes the per-edge scores and
coefficients from them (as SAR rematerialises them) instead of keeping ``E x heads`` tensors
alive between the passes. Two back-ends compute the same quantities: numba on float32 / float64
CPU tensors (:mod:`fullgraph.kernels.edge_attention_cpu`) and torch on any device
(:mod:`fullgraph.kernels.edge_attention_torch`); ``tests/kernels/test_edge_attention.py`` checks
both against a plain-autograd reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.backend import numba_or_torch
from fullgraph.kernels.edge_attention_cpu import attention_backward_numba, attention_forward_numba
from fullgraph.kernels.edge_attention_torch import (
    attention_backward_torch,
    attention_forward_torch,
)


class EdgeAttention(torch.autograd.Function):
    """Autograd of the attention aggregation; saves node-level tensors only."""

    @staticmethod
    def forward(
        ctx: Any,
        rows: torch.Tensor,
        adst: torch.Tensor | None,
        graph: AttentionGraph,
        heads: int,
        width: int,
        keys: np.ndarray | None,
        p: float,
        slope: float,
    ) -> torch.Tensor:
        """The aggregated rows, [num_inner, heads * width] (see :func:`edge_attention`)."""
        rows = rows.contiguous()
        ctx.adst_in_rows = adst is None
        if adst is None:
            adst = _dst_columns(rows, graph, heads, width)
        adst = adst.contiguous()
        backend = numba_or_torch(rows.device, rows.dtype, "edge_attention")
        run = attention_forward_numba if backend == "numba" else attention_forward_torch
        out, rmax, rden = run(graph, rows, adst, width, keys, p, slope)
        ctx.save_for_backward(rows, adst, rmax, rden)
        ctx.graph, ctx.width, ctx.keys, ctx.p, ctx.slope = graph, width, keys, p, slope
        ctx.backend = backend
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        """Gradients of ``rows`` (projections, source terms and, when they are there,
        destination terms) and of ``adst``."""
        rows, adst, rmax, rden = ctx.saved_tensors
        run = attention_backward_numba if ctx.backend == "numba" else attention_backward_torch
        g = grad.contiguous()
        grad_rows, grad_adst = run(
            ctx.graph, rows, adst, ctx.width, rmax, rden, g, ctx.keys, ctx.p, ctx.slope
        )
        if ctx.adst_in_rows:
            _dst_columns(grad_rows, ctx.graph, adst.shape[1], ctx.width).add_(grad_adst)
            grad_adst = None
        return grad_rows, grad_adst, None, None, None, None, None, None


def _dst_columns(rows: torch.Tensor, graph: AttentionGraph, heads: int, width: int) -> torch.Tensor:
    """The destination-term columns of ``rows`` (after the source terms), inner rows."""
    first = heads * (width + 1)
    return rows[: graph.num_inner, first : first + heads]


def _check(
    rows: torch.Tensor, adst: torch.Tensor | None, graph: AttentionGraph, heads: int, width: int
) -> None:
    """Raise ``ValueError`` on shapes :func:`edge_attention` cannot take."""
    need = heads * (width + (1 if adst is not None else 2))
    if rows.dim() != 2 or rows.shape[0] != graph.num_local or rows.shape[1] < need:
        raise ValueError(f"rows {tuple(rows.shape)}: need [{graph.num_local}, >= {need}]")
    if adst is not None and tuple(adst.shape) != (graph.num_inner, heads):
        raise ValueError(f"adst {tuple(adst.shape)}: need ({graph.num_inner}, {heads})")


def edge_attention(
    rows: torch.Tensor,
    adst: torch.Tensor | None,
    graph: AttentionGraph,
    *,
    heads: int,
    width: int,
    slope: float = 0.2,
    p: float = 0.0,
    keys: np.ndarray | None = None,
) -> torch.Tensor:
    """Attention-weighted sum over every inner node's in-neighbours and itself, per head.

    Args:
        rows: every local node's projected rows ``xp`` (columns ``[0, heads * width)``, head
            after head), then its source terms ``a_src . xp[j, h]`` (the next ``heads``
            columns), then, when ``adst`` is ``None``, its destination terms (the next
            ``heads``; read on the inner rows only); [num_local, >= heads * (width + 1 or 2)].
            Further columns are ignored (their gradient is 0).
        adst: destination terms ``a_dst . xp[i, h]`` of the inner nodes, [num_inner, heads],
            or ``None`` when they are columns of ``rows``.
        graph: the rank's :class:`AttentionGraph`.
        heads: number of heads.
        width: output width of every head.
        slope: LeakyReLU's negative slope.
        p: attention-dropout probability (0: none).
        keys: :func:`attention_keys` of the layer (needed when ``p > 0``).

    Returns:
        [num_inner, heads * width]: ``sum_j alpha_ij keep_ij / (1 - p) xp[j]`` per head.
    """
    _check(rows, adst, graph, heads, width)
    if p > 0 and keys is None:
        raise ValueError("attention dropout needs the layer's keys (attention_keys)")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention dropout probability {p} outside [0, 1)")
    return EdgeAttention.apply(rows, adst, graph, heads, width, keys if p > 0 else None, p, slope)
