"""Distributed twins of the PyG layers that read edge features: ``GINEConv``, ``GATConv(edge_dim)``.

Every edge is stored with the part that owns its target, its feature row aligned with the part's
``indices`` (``data.edge_attr`` of :func:`~fullgraph.pyg.load_part`), so a rank holds every
in-edge of its rows with its features: only the source rows of its halo nodes come from their
owners (:class:`~fullgraph.distributed.halo.HaloExchange`, whose backward returns their
gradients). The per-edge work then runs on this rank's edges with plain torch operations
(memory ``O(edges x width)``; no fused kernel yet), in the order of the part's edges, which is the
whole graph's order of each row's edges, so P ranks compute what one process computes.

Under ``precision="bf16-mixed"`` their linear maps (``lin``, ``lin_edge``, ``res``, the ``nn`` of
``GINEConv``) run their products in bfloat16 (:mod:`fullgraph.pyg.functional`), ``GATConv``'s
projected halo rows travel in bfloat16 (a bfloat16 product's rows: nothing lost), and the
per-edge messages, the attention softmax and the sums over edges stay float32 (as the ``gat``
layer kind's edge softmax).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.distributed.halo import HaloExchange
from fullgraph.errors import ConfigError
from fullgraph.kernels.attention_dropout import attention_keep, attention_keys
from fullgraph.pyg.part_data import SUM, PartGraph
from fullgraph.pyg.twins import Edges, GINConvTwin, _context


def _with_halo(
    rows: torch.Tensor, part: PartGraph, send_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``rows`` of the inner nodes followed by those of the halo nodes (from their owners);
    ``send_dtype`` (bf16-mixed: the rows of a bfloat16 product, which it holds exactly) is the
    dtype they travel in."""
    plan = part.plan
    if plan.comm.size == 1:
        return rows
    return torch.cat([rows, HaloExchange.apply(rows, plan, send_dtype)])


class GINEConvTwin(GINConvTwin):
    """``GINEConv`` on the rank's rows: ``nn((1 + eps) X_i + sum_j ReLU(X_j + lin(e_ji)))``.

    Args:
        conv: the PyG layer (its ``nn``, ``eps`` and ``lin`` when ``edge_dim`` was given).
        part: the rank's part.
    """

    def __init__(self, conv: nn.Module, part: PartGraph) -> None:
        super().__init__(conv, part)
        self.lin = conv.lin

    def forward(
        self,
        x: torch.Tensor,
        edge_index: Edges,
        edge_attr: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """This rank's rows of ``GINEConv(x, edge_index, edge_attr)`` (no bipartite input).

        Raises:
            ConfigError: ``edge_attr`` is missing or not the part's ``data.edge_attr``.
        """
        name = type(self).__name__
        if edge_attr is None:
            raise ConfigError(f"{name}: edge_attr is required (give data.edge_attr of the part)")
        self._part.check_edge_values(edge_attr, "edge_attr", name)
        _context(self, SUM, x, edge_index, size=size)
        e = edge_attr.to(x.dtype)
        if self.lin is not None:
            e = self.lin(e)
        elif e.shape[-1] != x.shape[-1]:
            raise ConfigError(
                f"{name}: edge_attr has {e.shape[-1]} columns but x has {x.shape[-1]}; give "
                f"GINEConv edge_dim= to project them"
            )
        src, dst = self._part.edges(x.device)
        messages = torch.relu(_with_halo(x, self._part)[src] + e)
        out = torch.zeros_like(x).index_add(0, dst, messages)
        return self.nn(out + (1 + self.eps) * x)


def _self_loop_attr(
    e: torch.Tensor, dst: torch.Tensor, rows: int, fill: float | str
) -> torch.Tensor:
    """The feature rows of the added self-loops, PyG's ``add_self_loops(fill_value=fill)``:
    ``"mean"`` / ``"add"`` of each row's incoming edges (0 for a node without any), or a
    number."""
    if isinstance(fill, (int, float)):
        return e.new_full((rows, e.shape[1]), float(fill))
    total = e.new_zeros(rows, e.shape[1]).index_add(0, dst, e)
    if fill == "add":
        return total
    count = torch.bincount(dst, minlength=rows).clamp(min=1).to(e.dtype)
    return total / count.unsqueeze(1)


class GATConvEdgeTwin(nn.Module):
    """``GATConv(edge_dim=F_e)`` on the rank's rows: attention logits
    ``a_src . x'_j + a_dst . x'_i + a_edge . lin_edge(e_ji)`` (LeakyReLU, softmax over the
    in-edges and the self-loop, whose features are PyG's ``fill_value``: the mean of the row's
    incoming edge features by default), attention dropout hashed from the edges' global ids
    (:func:`~fullgraph.kernels.attention_dropout.attention_keep`), heads joined, bias, ``res``.

    Args:
        conv: the PyG layer (``lin``, ``lin_edge``, ``att_src``, ``att_dst``, ``att_edge``,
            ``bias``, ``res`` taken over).
        part: the rank's part.
        index: the layer's ordinal among the model's attention layers (keys its
            attention-dropout masks).
    """

    def __init__(self, conv: nn.Module, part: PartGraph, index: int) -> None:
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.heads, self.concat, self.dropout = conv.heads, conv.concat, conv.dropout
        self.negative_slope, self.fill_value = conv.negative_slope, conv.fill_value
        self.lin, self.lin_edge = conv.lin, conv.lin_edge
        self.att_src, self.att_dst, self.att_edge = conv.att_src, conv.att_dst, conv.att_edge
        self.register_parameter("bias", conv.bias)
        self.res = conv.res
        self._part, self._index = part, index

    def forward(
        self,
        x: torch.Tensor,
        edge_index: Edges,
        edge_attr: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
        return_attention_weights: bool | None = None,
    ) -> torch.Tensor:
        """This rank's rows of ``GATConv(x, edge_index, edge_attr)``.

        Raises:
            ConfigError: ``edge_attr`` is not the part's ``data.edge_attr``.
        """
        name = type(self).__name__
        part = self._part
        if edge_attr is not None:
            part.check_edge_values(edge_attr, "edge_attr", name)
        _context(
            self, SUM, x, edge_index, size=size, return_attention_weights=return_attention_weights
        )
        H, C, ni = self.heads, self.out_channels, x.shape[0]
        xw = self.lin(x).view(ni, H, C)  # bf16-mixed: a bfloat16 product, widened
        lossless = x.dtype == torch.float32 and self.lin.bias is None
        send = part.plan.row_dtype if lossless else None
        rows = _with_halo(xw.reshape(ni, H * C), part, send).view(-1, H, C)
        src, dst = part.edges(x.device)
        keep = src != dst  # PyG removes existing self-loops (and their features) first
        src, dst = src[keep], dst[keep]
        loops = torch.arange(ni, device=x.device)
        src_all, dst_all = torch.cat([src, loops]), torch.cat([dst, loops])
        alpha = (rows * self.att_src).sum(-1)[src_all] + (xw * self.att_dst).sum(-1)[dst_all]
        if edge_attr is not None and self.lin_edge is not None:
            e = edge_attr.to(x.dtype)
            e = e.view(-1, 1) if e.dim() == 1 else e
            e = e[keep]
            e = torch.cat([e, _self_loop_attr(e, dst, ni, self.fill_value)])
            alpha = alpha + (self.lin_edge(e).view(-1, H, C) * self.att_edge).sum(-1)
        alpha = F.leaky_relu(alpha, self.negative_slope)
        index = dst_all.unsqueeze(1).expand(-1, H)
        top = alpha.new_full((ni, H), float("-inf"))
        top = top.scatter_reduce(0, index, alpha.detach(), "amax", include_self=True)
        alpha = (alpha - top[dst_all]).exp()
        alpha = alpha / (alpha.new_zeros(ni, H).index_add(0, dst_all, alpha) + 1e-16)[dst_all]
        if self.training and self.dropout > 0:
            gids = torch.from_numpy(np.asarray(part.part.global_ids, dtype=np.int64))
            gids = gids.to(x.device)
            keys = attention_keys(part.seed, part.step, self._index, H)
            mask = attention_keep(gids[dst_all], gids[src_all], keys, H, self.dropout)
            alpha = alpha * mask / (1.0 - self.dropout)
        messages = rows[src_all] * alpha.unsqueeze(-1)
        out = xw.new_zeros(ni, H, C).index_add(0, dst_all, messages)
        out = out.reshape(ni, H * C) if self.concat else out.mean(dim=1)
        if self.res is not None:
            out = out + self.res(x)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, "
            f"edge_dim={self.lin_edge.in_features if self.lin_edge is not None else None}"
        )
