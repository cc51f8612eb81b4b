"""The graph attention layer (Velickovic et al.; PyG ``GATConv``).

Per head ``h``: ``x' = x W_h``, ``alpha_ij = softmax_j(LeakyReLU(a_src . x'_j + a_dst . x'_i))``
over the in-neighbours ``j`` of ``i`` and ``i`` itself (a self-loop is added), dropout on
``alpha`` in training, ``out_i = sum_j alpha_ij x'_j``; hidden layers concatenate their heads,
the last layer averages them; then a bias. Semantics, initialisation (Glorot for the projection
and both attention vectors, zero bias) and parameter shapes are those of ``GATConv(in, width,
heads, concat, negative_slope=0.2, dropout=attention_dropout, add_self_loops=True, bias=True)``.

Distribution: an edge-cut part holds every in-edge of its inner nodes (``ctx.structure``), so
the softmax of a row is complete on its rank; only the halo nodes' rows must come from their
owners (:class:`~fullgraph.distributed.halo.HaloExchange`, whose backward returns their
gradients). Per layer the narrower of two exchanges is chosen, by width alone (the same choice
on every rank):

- the layer's INPUT rows (``in_dim`` columns) when ``in_dim < heads * (width + 1)``; each rank
  then recomputes ``x W`` and ``a_src . x'`` for its halo rows (the product covers the halo rows
  too: a few percent more rows on an edge-cut partition);
- else the PROJECTED rows with their source attention terms, ``[x W | a_src . x']``
  (``heads * (width + 1)`` columns): no halo work, and a wide input (bag of words) never moves.

Attention dropout: the mask of edge ``j -> i``, head ``h`` is a counter hash of (seed, epoch,
layer index, head, global ids of ``i`` and ``j``)
(:func:`~fullgraph.kernels.attention_dropout.attention_keep`; self-loops are edges ``i -> i``),
so P ranks drop exactly what one process drops. Memory: the edge part (scores, softmax,
dropout, weighted sum) is one autograd function
(:class:`~fullgraph.kernels.edge_attention.EdgeAttention`) that saves node-level tensors only and
recomputes the per-edge ones in the backward pass. The projection and both attention terms come
from one product with ``[W ; W_src ; W_dst]`` (:meth:`GATLayer.extended_weight`), whose first
``heads * (width + 1)`` columns are the rows the attention reads and, on several ranks, the
projected rows exchanged.

Under the step's block tree (:mod:`fullgraph.distributed.tree_sum`: a partition with fixed node
blocks) a training step is the same bits at any rank count: the extended weight is a stand-in
(:meth:`~fullgraph.distributed.tree_sum.BlockGradients.derive`) applied to the inner rows only,
its gradient summed per block over the tree and then taken back to ``lin.weight``, ``att_src``
and ``att_dst``; the halo rows are always the projected rows (without a gradient), and every
source's gradient is summed on its owner in a fixed order
(:class:`~fullgraph.distributed.ordered_attention.OrderedAttention`); the bias's gradient is
its row sums per block (:func:`~fullgraph.models.tree_bias.tree_bias`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fullgraph.config import check_number, check_probability
from fullgraph.distributed.halo import HaloExchange
from fullgraph.distributed.ordered_attention import OrderedAttention
from fullgraph.distributed.tree_sum import BlockGradients, active_gradients
from fullgraph.kernels import CSRMatrix
from fullgraph.kernels.attention_dropout import attention_keys
from fullgraph.kernels.attention_graph import AttentionGraph
from fullgraph.kernels.edge_attention import edge_attention
from fullgraph.models.context import GraphContext
from fullgraph.models.layers.base import (
    ExportArgs,
    GraphLayer,
    LayerOptions,
    PygExport,
    register_layer,
    times_weight,
)
from fullgraph.models.local_graph import local_csr, no_operator
from fullgraph.models.mixed_linear import mixed_linear
from fullgraph.models.tree_bias import tree_bias

if TYPE_CHECKING:
    from fullgraph.partition import Partition

#: LeakyReLU's negative slope of the attention scores (PyG's default).
NEGATIVE_SLOPE = 0.2


def _glorot_(t: torch.Tensor) -> None:
    """PyG's ``glorot``: uniform in ``+-sqrt(6 / (size(-2) + size(-1)))``."""
    bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-bound, bound)


def _gat_kwargs(args: ExportArgs) -> dict[str, int | str | bool] | None:
    """PyG's ``GAT``: one head count for every layer, its ``hidden_channels`` counting all the
    heads; none when the last layer has other heads than the hidden ones."""
    heads, out = args["output_heads"], {}
    if args["num_layers"] > 1:
        if args["heads"] != heads:
            return None
        out["hidden_channels"] = args["hidden_channels"] * heads  # PyG: all heads
    out["heads"] = heads
    return out


@register_layer
class GATLayer(GraphLayer):
    """Multi-head graph attention: ``[num_inner, in_dim] -> [num_inner, out_dim]``.

    Args:
        in_dim: input width.
        width: output width of every head.
        heads: number of heads.
        concat: concatenate the heads (``out_dim = heads * width``) or average them
            (``out_dim = width``).
        attention_dropout: drop probability of the attention coefficients in training.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, heads * width] or [num_inner, width]

    Attributes:
        lin: the projection, weight [heads * width, in_dim], no bias (PyG ``lin``).
        att_src, att_dst: attention vectors, [1, heads, width].
        bias: [out_dim].
    """

    kind = "gat"
    precomputable = False
    accepts = ("heads", "output_heads", "attention_dropout")
    pyg = PygExport(
        conv="GATConv",
        name="GAT",
        keys={
            "lin.weight": "lin.weight",
            "att_src": "att_src",
            "att_dst": "att_dst",
            "bias": "bias",
        },
        basic_gnn="GAT",
        basic_kwargs=_gat_kwargs,
    )
    replay = "attention"

    def __init__(
        self,
        in_dim: int,
        width: int,
        heads: int = 1,
        *,
        concat: bool = True,
        attention_dropout: float = 0.0,
    ) -> None:
        check_number("--heads", heads, low=1, integer=True)
        check_probability("--attention-dropout", attention_dropout)
        super().__init__(in_dim, width * heads if concat else width)
        self.width, self.heads, self.concat = width, heads, concat
        self.attention_dropout = attention_dropout
        self.lin = nn.Linear(in_dim, heads * width, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, width))
        self.att_dst = nn.Parameter(torch.empty(1, heads, width))
        self.bias = nn.Parameter(torch.zeros(self.out_dim))
        nn.init.xavier_uniform_(self.lin.weight)
        _glorot_(self.att_src)
        _glorot_(self.att_dst)

    @classmethod
    def build(cls, in_dim: int, width: int, *, last: bool, options: LayerOptions) -> GraphLayer:
        """A hidden layer concatenates ``options.heads`` heads of ``width``; the last layer
        averages ``options.output_heads`` heads of ``width`` (the classes).

        Raises:
            ConfigError: a head count below 1 (naming ``--heads`` or ``--output-heads``) or an
                attention dropout outside ``[0, 1)``.
        """
        heads = options.output_heads if last else options.heads
        check_number("--output-heads" if last else "--heads", heads, low=1, integer=True)
        return cls(
            in_dim,
            width,
            heads,
            concat=not last,
            attention_dropout=options.attention_dropout,
        )

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """No fixed operator: attention weighs the edges of ``ctx.structure`` itself, so an
        empty matrix (rows = inner nodes, no entries) stands in for it."""
        return no_operator(local_csr(part), int(part.num_inner))

    @property
    def exchanges_input(self) -> bool:
        """Whether the halo exchange carries the input rows (else the projected rows and their
        source terms): the narrower of ``in_dim`` and ``heads * (width + 1)``."""
        return self.in_dim < self.heads * (self.width + 1)

    def extended_weight(self) -> torch.Tensor:
        """``[W ; W_src ; W_dst]``, [heads * (width + 2), in_dim]: one product gives every row's
        projection ``x W`` and its source and destination terms (``a . (x W_h) = x (W_h^T
        a)``, so ``W_src[h] = sum_c a_src[h, c] W[h, c, :]``)."""
        w = self.lin.weight.view(self.heads, self.width, -1)
        w_src = (w * self.att_src.view(self.heads, self.width, 1)).sum(dim=1)
        w_dst = (w * self.att_dst.view(self.heads, self.width, 1)).sum(dim=1)
        return torch.cat([self.lin.weight, w_src, w_dst])

    def forward(
        self,
        h: torch.Tensor | CSRMatrix,
        ctx: GraphContext,
        precomputed: torch.Tensor | None = None,
        *,
        epoch: int = 0,
        training: bool = False,
        index: int = 0,
        rebuild: Callable[[], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention over every inner node's in-neighbours and itself, heads joined, + bias.

        Args:
            h: this rank's input rows (dense; a CSR input only when the projected rows are
                exchanged).
            ctx: the rank's context (``structure`` and ``local_global_ids`` are used).
            precomputed: must be ``None`` (attention cannot be precomputed).
            epoch: the epoch (keys the attention-dropout masks).
            training: apply attention dropout.
            index: the layer's position in the stack (keys the masks).
            rebuild: unused (the input is kept: the halo rows' projection needs it).
        """
        if precomputed is not None:
            raise ValueError("a GAT layer's aggregation cannot be precomputed")
        if ctx.structure is None:
            raise ValueError("GAT needs ctx.structure, the part's local CSR of in-edges")
        plan = ctx.plan
        distributed = plan.comm.size > 1
        if distributed and ctx.local_global_ids is None:
            raise ValueError("GAT on several ranks needs ctx.local_global_ids")
        graph = AttentionGraph.of(ctx.structure, ctx.local_global_ids)
        sent = self.heads * (self.width + 1)  # the projected rows and the source terms
        weight = self.extended_weight()
        p = self.attention_dropout if training else 0.0
        keys = attention_keys(ctx.seed, epoch, index, self.heads) if p > 0 else None
        tree = active_gradients()
        if tree is not None:
            return self._forward_ordered(h, ctx, graph, tree, weight, keys, p)
        if distributed and self.exchanges_input:
            if isinstance(h, CSRMatrix):
                raise TypeError("GAT exchanges its input here: give it dense rows")
            both = torch.cat([h, HaloExchange.apply(h, plan, plan.row_dtype)])
            rows = mixed_linear(both, weight, plan.row_dtype)
            adst = None  # columns of rows
        else:  # bf16-mixed: a bfloat16 product, float32 rows and gradients (docs: Precision)
            dense = not isinstance(h, CSRMatrix)
            rows = mixed_linear(h, weight, plan.row_dtype) if dense else times_weight(h, weight)
            adst = None
            if distributed:
                adst = rows[:, sent:]
                bf16 = plan.row_dtype if dense else None  # rows of a bf16 product: lossless
                halo = HaloExchange.apply(rows[:, :sent], plan, bf16)
                rows = torch.cat([rows[:, :sent], halo])
        out = edge_attention(
            rows,
            adst,
            graph,
            heads=self.heads,
            width=self.width,
            slope=NEGATIVE_SLOPE,
            p=p,
            keys=keys,
        )
        if not self.concat:
            out = out.view(-1, self.heads, self.width).mean(dim=1)
        return out + self.bias

    def _forward_ordered(
        self,
        h: torch.Tensor | CSRMatrix,
        ctx: GraphContext,
        graph: AttentionGraph,
        tree: BlockGradients,
        weight: torch.Tensor,
        keys: np.ndarray | None,
        p: float,
    ) -> torch.Tensor:
        """The training step under the block tree: the same bits at any rank count.

        The extended weight is a stand-in (:meth:`~fullgraph.distributed.tree_sum.
        BlockGradients.derive`) applied to the inner rows only (its gradient per block, then
        back to ``lin.weight``, ``att_src``, ``att_dst``); the halo rows' ``[xp | asrc]`` come
        from their owners without a gradient (the projected-rows exchange, whatever the
        widths), and :class:`~fullgraph.distributed.ordered_attention.OrderedAttention` sums
        every source's gradient on its owner in a fixed order; the bias's row sums per block
        (:func:`~fullgraph.models.tree_bias.tree_bias`).
        """
        plan = ctx.plan
        sent = self.heads * (self.width + 1)
        dense = not isinstance(h, CSRMatrix)
        rows = h.num_rows if isinstance(h, CSRMatrix) else int(h.shape[0])
        if dense and weight.requires_grad and tree.handles(self.lin.weight, rows):
            stand_in = weight.detach().requires_grad_()
            tree.derive(stand_in, weight, [self.lin.weight, self.att_src, self.att_dst])
            weight = stand_in  # a leaf over every inner row: mixed_linear pushes its partials
        inner = mixed_linear(h, weight, plan.row_dtype) if dense else times_weight(h, weight)
        halo = None
        if plan.comm.size > 1:
            bf16 = plan.row_dtype if dense else None  # rows of a bf16 product: lossless
            halo = HaloExchange.apply(inner[:, :sent].detach(), plan, bf16)
        out = OrderedAttention.apply(
            inner,
            halo,
            graph,
            ctx.structure,
            plan,
            graph.global_ids,
            self.heads,
            self.width,
            keys,
            p,
            NEGATIVE_SLOPE,
        )
        if not self.concat:
            out = out.view(-1, self.heads, self.width).mean(dim=1)
        return tree_bias(out, self.bias)
