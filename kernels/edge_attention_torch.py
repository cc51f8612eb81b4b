"""The torch back-end of :func:`~fullgraph.kernels.edge_attention.edge_attention` (any device).

The steps of the numba kernels (:mod:`fullgraph.kernels.edge_attention_cpu`) with
``index_select`` / ``scatter_reduce`` / ``index_add_``: the per-edge scores, coefficients and
attention-dropout mask (:func:`~fullgraph.kernels.attention_dropout.attention_keep`) are
recomputed from the node-level tensors, and the gathered ``E x heads x width`` products are
formed in chunks of :data:`_TORCH_CHUNK_ELEMENTS`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.kernels.attention_dropout import attention_keep
from fullgraph.kernels.attention_graph import AttentionGraph

#: Edge-head elements gathered per chunk by the torch back-end (bounds its temporaries).
_TORCH_CHUNK_ELEMENTS = 1 << 22


def _split(rows: torch.Tensor, heads: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The projected rows and the source terms: views of ``rows``'s leading columns."""
    hc = heads * width
    return rows[:, :hc], rows[:, hc : hc + heads]


def _coefficients(
    g: AttentionGraph,
    asrc: torch.Tensor,
    adst: torch.Tensor,
    rmax: torch.Tensor,
    rden: torch.Tensor,
    keys: np.ndarray | None,
    p: float,
    slope: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, cols, pre-activation scores, alpha, coef = alpha * keep * scale) of every edge."""
    rows, cols = g.edges_with_loops(asrc.device)
    pre = asrc.index_select(0, cols) + adst.index_select(0, rows)
    alpha = torch.exp(F.leaky_relu(pre, slope) - rmax.index_select(0, rows))
    alpha = alpha / rden.index_select(0, rows)
    coef = alpha
    if keys is not None and p > 0:
        gids = g.gids_tensor(asrc.device)
        keep = attention_keep(gids[rows], gids[cols], keys, asrc.shape[1], p)
        coef = alpha * keep.to(alpha.dtype) * (1.0 / (1.0 - p))
    return rows, cols, pre, alpha, coef


def _step(heads: int, width: int) -> int:
    """Edges per chunk of the torch back-end's gathered ``[edges, heads, width]`` products."""
    return max(1, _TORCH_CHUNK_ELEMENTS // max(heads * width, 1))


def attention_forward_torch(
    g: AttentionGraph,
    rows_in: torch.Tensor,
    adst: torch.Tensor,
    width: int,
    keys: np.ndarray | None,
    p: float,
    slope: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, rmax, rden) in torch ops (any device, no autograd)."""
    heads = adst.shape[1]
    xp, asrc = _split(rows_in, heads, width)
    rows, cols = g.edges_with_loops(adst.device)
    s = F.leaky_relu(asrc.index_select(0, cols) + adst.index_select(0, rows), slope)
    index = rows[:, None].expand(-1, heads)
    rmax = torch.full((g.num_inner, heads), -torch.inf, dtype=adst.dtype, device=adst.device)
    rmax = rmax.scatter_reduce(0, index, s, "amax", include_self=True)
    rden = torch.zeros_like(rmax).index_add_(0, rows, torch.exp(s - rmax.index_select(0, rows)))
    del s
    *_, coef = _coefficients(g, asrc, adst, rmax, rden, keys, p, slope)
    out = torch.zeros((g.num_inner, heads, width), dtype=adst.dtype, device=adst.device)
    x3 = xp.reshape(-1, heads, width)
    step = _step(heads, width)
    for lo in range(0, rows.numel(), step):
        r, c = rows[lo : lo + step], cols[lo : lo + step]
        out.index_add_(0, r, coef[lo : lo + step, :, None] * x3.index_select(0, c))
    return out.view(g.num_inner, heads * width), rmax, rden


def attention_backward_torch(
    g: AttentionGraph,
    rows_in: torch.Tensor,
    adst: torch.Tensor,
    width: int,
    rmax: torch.Tensor,
    rden: torch.Tensor,
    grad: torch.Tensor,
    keys: np.ndarray | None,
    p: float,
    slope: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_rows, grad_adst) in torch ops (any device, no autograd)."""
    heads = adst.shape[1]
    xp, asrc = _split(rows_in, heads, width)
    rows, cols, pre, alpha, coef = _coefficients(g, asrc, adst, rmax, rden, keys, p, slope)
    x3 = xp.reshape(-1, heads, width)
    g3 = grad.view(-1, heads, width)
    grad_xp = torch.zeros_like(x3)
    dcoef = torch.empty_like(coef)
    step = _step(heads, width)
    for lo in range(0, rows.numel(), step):
        r, c = rows[lo : lo + step], cols[lo : lo + step]
        gr = g3.index_select(0, r)
        dcoef[lo : lo + step] = (gr * x3.index_select(0, c)).sum(-1)
        grad_xp.index_add_(0, c, coef[lo : lo + step, :, None] * gr)
    ad = coef * dcoef  # alpha * d loss / d alpha
    dot_sum = torch.zeros_like(rmax).index_add_(0, rows, ad)
    dscore = ad - alpha * dot_sum.index_select(0, rows)
    dscore = torch.where(pre > 0, dscore, dscore * slope)
    grad_rows = torch.zeros_like(rows_in)
    grad_rows[:, : heads * width] = grad_xp.view(-1, heads * width)
    grad_rows[:, heads * width : heads * (width + 1)].index_add_(0, cols, dscore)
    grad_adst = torch.zeros_like(adst).index_add_(0, rows, dscore)
    return grad_rows, grad_adst
