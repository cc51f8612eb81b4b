"""Distributed twins of PyG layers: the same parameters, the rank's rows, exact across ranks.

A twin takes the place of a PyG (or torch) module in the user's model and holds that module's
parameters and buffers themselves (the same ``nn.Parameter`` objects, under the same names, so
the optimiser built on the model keeps working and ``state_dict`` keys are unchanged). It is
called as the original (``conv(x, edge_index)``), with ``edge_index`` the part's
:class:`~fullgraph.pyg.part_data.PartGraph`, and computes this rank's rows of what the original
computes on the whole graph:

- ``GCNConv`` and ``SAGEConv(aggr="mean")`` aggregate with the operators of
  :mod:`fullgraph.models.layers` (global degrees; halo rows exchanged, overlapped with the inner
  product), transforming first when that narrows the exchange; ``SAGEConv(aggr="sum")`` and
  ``GINConv`` with the plain sum over the incoming neighbours (the ``gin`` layer kind's
  operator, :data:`~fullgraph.pyg.part_data.SUM`); ``GraphConv`` with either;
- ``SAGEConv(aggr="max")`` and ``GraphConv(aggr="max")`` exchange their input's halo rows and
  take the maximum over ``[inner; halo]`` rows, ties to the lowest global id
  (:meth:`~fullgraph.models.context.GraphContext.aggregate_max`); their products stay float32
  under ``precision="bf16-mixed"``, as ``fullgraph train``'s max layers;
- under the step's block tree (:mod:`fullgraph.pyg.runtime`) every weight product over the
  inner rows (``F.linear``, the maximum's products) and every bias added
  after an aggregation (:func:`~fullgraph.models.tree_bias.tree_bias`) pushes per-block
  partials: bit-identical at any rank count;
- ``GCNConv(improved=True)`` and ``GCNConv`` called with the part's ``edge_weight`` use the
  weighted operator (global weighted degrees from the part's ``in_weight``); ``GINEConv`` and
  ``GATConv(edge_dim=...)`` read the part's edge features (:mod:`fullgraph.pyg.edge_twins`);
- ``GATConv`` is the ``gat`` layer kind of :mod:`fullgraph.models.layers` (attention dropout
  from counter hashes);
- ``BatchNorm1d`` (also inside PyG's ``BatchNorm``) is
  :class:`~fullgraph.models.norm.GraphBatchNorm`: moments over every rank's rows;
- ``Dropout`` is :func:`fullgraph.pyg.dropout`: masks hashed from the global node ids;
- PyG's ``TrimToLayer`` (inside every ``BasicGNN``) refuses the sampled-subgraph arguments.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.distributed.tree_sum import BlockGradients, active_gradients
from fullgraph.errors import ConfigError
from fullgraph.models.context import GraphContext
from fullgraph.models.layers import LayerOptions, layer_class
from fullgraph.models.mixed_linear import mixed_linear
from fullgraph.models.norm import GraphBatchNorm
from fullgraph.models.tree_bias import tree_bias
from fullgraph.pyg.helpers import dropout
from fullgraph.pyg.part_data import SUM, PartAdjT, PartGraph

if TYPE_CHECKING:
    from fullgraph.distributed import Communicator

#: What a twin takes as ``edge_index``: ``data.edge_index`` or ``data.adj_t`` of its part
#: (anything else is refused by :func:`_context`).
Edges = PartGraph | PartAdjT


def _context(
    twin: nn.Module,
    kind: str,
    x: torch.Tensor,
    edge_index: Edges,
    *,
    options: LayerOptions | None = None,
    unweighted_adj: bool = False,
    **unused: Any,
) -> GraphContext:
    """The context of ``twin``'s part after checking the call (rows, edge_index, options);
    ``options`` are the layer options of ``kind`` (:data:`MAX`: the maximum's context; ``gcn``'s
    ``edge_weight`` and ``improved``); ``unused`` the call's arguments the twin refuses.
    ``edge_index`` is ``data.edge_index`` or ``data.adj_t``; a weighted ``adj_t`` is refused
    unless the layer takes the weights (``options.edge_weight``) or PyG's layer ignores them
    (``unweighted_adj``: ``GATConv``)."""
    name = type(twin).__name__
    part: PartGraph = twin._part
    weighted = options is not None and options.edge_weight
    if edge_index is part.adj_t:
        if part.adj_t.weighted and not (weighted or unweighted_adj):
            error = ConfigError(
                f"{name}: data.adj_t carries the graph's edge weights (its values), which only "
                f"GCNConv takes here; pass data.edge_index to {name} (PyG would weigh its "
                f"aggregation by adj_t's values), or drop the weights (T.ToSparseTensor(attr=None))"
            )
            error.alike = True  # type: ignore[attr-defined]  # every part has weights or none
            raise error
    elif edge_index is not part:
        raise ConfigError(
            f"{name}: edge_index must be data.edge_index (or data.adj_t) of the data the model "
            f"was converted with (the rank's part), not {type(edge_index).__name__}"
        )
    given = [k for k, v in unused.items() if v is not None]
    if given:
        raise ConfigError(f"{name}: {', '.join(given)} is not supported by the distributed layer")
    part.check_rows(x, name)
    return part.context(kind, x, options=options)


#: The layer options of a context for the maximum over neighbours (edges and local global ids).
MAX = LayerOptions(aggr="max")


def _apply(x: torch.Tensor, lin: nn.Module) -> torch.Tensor:
    """``lin(x)``: under bf16-mixed a bfloat16 product (:mod:`fullgraph.pyg.functional`)."""
    return lin(x)


def _float32(x: torch.Tensor, lin: nn.Module) -> torch.Tensor:
    """``lin(x)`` in float32 at any precision (``addmm``, which a bf16-mixed forward leaves as
    written; the kernel ``F.linear`` calls): the products of the maximum's layers, as in
    ``fullgraph train`` (docs/train.md, "Precision")."""
    if part_tree(x) is not None:  # float32 under the block tree: its per-block partials
        return mixed_linear(x, lin.weight, None, lin.bias)
    if lin.bias is None:
        return torch.mm(x, lin.weight.t())
    return torch.addmm(lin.bias, x, lin.weight.t())


def part_tree(x: torch.Tensor) -> BlockGradients | None:
    """The step's block tree when the products of ``x`` (node rows) take it: a tree in force
    (:mod:`~fullgraph.pyg.runtime`: a float32 training pass) and ``x`` every inner row."""
    tree = active_gradients()
    if tree is None or int(x.shape[0]) != tree.layout.num_rows:
        return None
    return tree


def _aggregate_by(
    twin: nn.Module,
    aggr: str,
    x: torch.Tensor,
    src: torch.Tensor,
    edge_index: Edges,
    lin: nn.Module,
    **unused: Any,
) -> torch.Tensor:
    """``lin(aggr(src_N(i)))`` on ``twin``'s part: the mean or sum operator (transforming first
    when that narrows the exchange), or the maximum of ``src``'s rows over the incoming
    neighbours (its halo rows exchanged, :meth:`GraphContext.aggregate_max`). ``x`` is the
    layer's input (its rows are checked), ``unused`` the call's refused arguments."""
    if aggr == "max":
        ctx = _context(twin, "sage", x, edge_index, options=MAX, **unused)
        return _float32(ctx.aggregate_max(src), lin)
    ctx = _context(twin, "sage" if aggr == "mean" else SUM, x, edge_index, **unused)
    return _aggregate_linear(ctx, src, lin.weight, lin.bias)


def _aggregate_linear(
    ctx: GraphContext, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``A x W^T + b``, transforming first when that narrows the halo exchange (as the
    full-batch layers do: both orders give the same result up to rounding)."""
    if weight.shape[0] <= weight.shape[1]:
        out = ctx.aggregate(F.linear(x, weight))
        return out if bias is None else tree_bias(out, bias)  # under the tree: per block
    return F.linear(ctx.aggregate(x), weight, bias)


@functools.cache
def _improved_without_weights() -> bool:
    """Whether the installed PyG's ``GCNConv(improved=True)`` fills the self-loops with 2 when
    called without ``edge_weight`` (PyG 2.8's ``gcn_norm`` of an ``edge_index`` tensor does not:
    ``add_remaining_self_loops`` drops the fill when there are no weights). Asked of PyG once,
    on a one-edge graph, so that the twin computes what the original layer computes."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    _, norm = gcn_norm(torch.tensor([[0], [1]]), None, 2, improved=True)
    return bool(abs(float(norm[-1]) - 2.0 / 3.0) < 1e-6)  # node 1's loop: 2 / (1 + 2)


class GCNConvTwin(nn.Module):
    """``GCNConv`` on the rank's rows: ``D^-1/2 (A_w + f I) D^-1/2 (X W) + b``, global degrees.

    ``f`` is 2 with ``improved=True``, else 1; ``A_w`` holds the part's edge weights when the call
    passes ``edge_weight=data.edge_weight`` (of the part, :func:`~fullgraph.pyg.load_part`) or
    is called with ``data.adj_t`` of a weighted graph (PyG weighs by a weighted ``adj_t``'s
    values), else ones. Without weights, ``improved`` acts as it does in the installed PyG:
    an ``adj_t`` fills 2, an ``edge_index`` (:func:`_improved_without_weights`) not at all in
    PyG 2.8.

    Args:
        conv: the PyG layer (its ``lin`` and ``bias`` are taken over).
        part: the rank's part.
    """

    def __init__(self, conv: nn.Module, part: PartGraph) -> None:
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.improved = bool(conv.improved)
        self.lin = conv.lin
        self.register_parameter("bias", conv.bias)
        self._part = part

    def forward(
        self, x: torch.Tensor, edge_index: Edges, edge_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This rank's rows of ``GCNConv(x, edge_index, edge_weight)``.

        Raises:
            ConfigError: ``edge_weight`` is not the part's ``data.edge_weight``.
        """
        name = type(self).__name__
        if edge_weight is not None:
            self._part.check_edge_values(edge_weight, "edge_weight", name)
        adj_t = edge_index is self._part.adj_t  # PyG: adj_t's values weigh, improved fills 2
        weighted = edge_weight is not None or (adj_t and self._part.adj_t.weighted)
        improved = self.improved and (weighted or adj_t or _improved_without_weights())
        options = LayerOptions(edge_weight=weighted, improved=improved)
        ctx = _context(self, "gcn", x, edge_index, options=options)
        return _aggregate_linear(ctx, x, self.lin.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, improved={self.improved}"


class SAGEConvTwin(nn.Module):
    """``SAGEConv(aggr="mean")`` on the rank's rows: ``mean(X_N(i)) W_l + b + X_i W_r``
    (``aggr="sum"`` or ``"add"``: the sum of the neighbours; ``"max"``: their maximum).

    ``project`` (a ReLU-activated linear map of the neighbours first), ``root_weight`` and
    ``normalize`` behave as in PyG.

    Args:
        conv: the PyG layer (its ``lin_l``, ``lin_r`` and ``lin`` are taken over).
        part: the rank's part.
    """

    def __init__(self, conv: nn.Module, part: PartGraph) -> None:
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.aggr = conv.aggr if conv.aggr in ("mean", "max") else "sum"
        self.normalize, self.root_weight = conv.normalize, conv.root_weight
        self.project = bool(conv.project)
        if self.project:
            self.lin = conv.lin
        self.lin_l = conv.lin_l
        if self.root_weight:
            self.lin_r = conv.lin_r
        self._part = part

    def forward(
        self, x: torch.Tensor, edge_index: Edges, size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """This rank's rows of ``SAGEConv(x, edge_index)`` (no bipartite input)."""
        linear = _float32 if self.aggr == "max" else _apply
        src = linear(x, self.lin).relu() if self.project else x
        out = _aggregate_by(self, self.aggr, x, src, edge_index, self.lin_l, size=size)
        if self.root_weight:
            out = out + linear(x, self.lin_r)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr}"


class GraphConvTwin(nn.Module):
    """``GraphConv`` on the rank's rows: ``aggr(X_N(i)) W_rel + b_rel + X_i W_root`` with the
    sum (``aggr="add"``), mean or maximum over the incoming neighbours (as :class:`SAGEConvTwin`).

    Args:
        conv: the PyG layer (its ``lin_rel`` and ``lin_root`` are taken over).
        part: the rank's part.
    """

    def __init__(self, conv: nn.Module, part: PartGraph) -> None:
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.aggr = conv.aggr if conv.aggr in ("mean", "max") else "sum"
        self.lin_rel, self.lin_root = conv.lin_rel, conv.lin_root
        self._part = part

    def forward(
        self,
        x: torch.Tensor,
        edge_index: Edges,
        edge_weight: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """This rank's rows of ``GraphConv(x, edge_index)`` (no edge weights, no bipartite
        input)."""
        out = _aggregate_by(
            self, self.aggr, x, x, edge_index, self.lin_rel, edge_weight=edge_weight, size=size
        )
        linear = _float32 if self.aggr == "max" else _apply
        return out + linear(x, self.lin_root)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr}"


class GINConvTwin(nn.Module):
    """``GINConv`` on the rank's rows: ``nn((1 + eps) X_i + sum(X_N(i)))``.

    The sum over the incoming neighbours is the part's sum operator (halo rows exchanged);
    ``nn`` is the PyG layer's own module (converted in turn by :func:`fullgraph.pyg.distribute`:
    an ``MLP``'s ``BatchNorm`` takes its moments over all ranks).

    Args:
        conv: the PyG layer (its ``nn`` and ``eps``, a buffer or with ``train_eps`` a
            parameter, are taken over).
        part: the rank's part.
    """

    #: Children :func:`fullgraph.pyg.distribute` converts in turn.
    CONVERT_CHILDREN = ("nn",)

    def __init__(self, conv: nn.Module, part: PartGraph) -> None:
        super().__init__()
        self.nn = conv.nn
        self.initial_eps = conv.initial_eps
        if isinstance(conv.eps, nn.Parameter):
            self.eps = conv.eps
        else:
            self.register_buffer("eps", conv.eps)
        self._part = part

    def forward(
        self, x: torch.Tensor, edge_index: Edges, size: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """This rank's rows of ``GINConv(x, edge_index)`` (no bipartite input)."""
        ctx = _context(self, SUM, x, edge_index, size=size)
        tree = part_tree(x)
        if tree is not None and tree.handles(self.eps, int(x.shape[0])):
            return self.nn(_TreeEps.apply(ctx.aggregate(x), x, self.eps, tree))
        return self.nn(ctx.aggregate(x) + (1 + self.eps) * x)

    def extra_repr(self) -> str:
        return f"eps={self.initial_eps}, train_eps={isinstance(self.eps, nn.Parameter)}"


class _TreeEps(torch.autograd.Function):
    """``m + (1 + eps) x`` (the same bits); ``eps``'s gradient, ``sum(dOut * x)``, per block
    into the step's block tree (:meth:`~fullgraph.distributed.tree_sum.BlockGradients.add`)."""

    @staticmethod
    def forward(
        ctx: Any, m: torch.Tensor, x: torch.Tensor, eps: torch.Tensor, tree: BlockGradients
    ) -> torch.Tensor:
        """``m + (1 + eps) x``."""
        ctx.save_for_backward(x)
        ctx.eps, ctx.tree = eps, tree
        return m + (1 + eps) * x

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        """``dOut`` for ``m``, ``(1 + eps) dOut`` for ``x``; ``eps``'s partials pushed."""
        (x,) = ctx.saved_tensors
        eps = ctx.eps
        ctx.tree.add(eps, lambda d, r: (d * r).sum().reshape(eps.shape), dy.contiguous(), x)
        dx = dy * (1 + eps.detach()) if ctx.needs_input_grad[1] else None
        return dy, dx, None, None


class TrimToLayerTwin(nn.Module):
    """PyG's ``TrimToLayer`` (every ``BasicGNN`` holds one): called only for sampled
    subgraphs (``num_sampled_nodes_per_hop``), which a full graph part is not."""

    def forward(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refuse: the model was given the sampled-subgraph arguments.

        Raises:
            ConfigError: always.
        """
        raise ConfigError(
            "num_sampled_nodes_per_hop / num_sampled_edges_per_hop (trimming a sampled "
            "subgraph per layer) do not apply to a distributed model: it runs on the whole graph"
        )


@functools.cache
def gat_twin_class() -> type[nn.Module]:
    """The twin of ``GATConv``: a subclass of the ``gat`` layer kind (looked up on first use).

    Raises:
        ConfigError: no ``gat`` layer kind is registered.
    """
    base = layer_class("gat")

    class GATConvTwin(base):  # type: ignore[valid-type,misc]
        """``GATConv`` on the rank's rows: the ``gat`` layer with the PyG layer's parameters.

        Args:
            conv: the PyG layer (``lin``, ``att_src``, ``att_dst``, ``bias``, ``res``).
            part: the rank's part.
            index: the layer's ordinal among the model's attention layers (keys its
                attention-dropout masks).
        """

        def __init__(self, conv: nn.Module, part: PartGraph, index: int) -> None:
            with torch.random.fork_rng(devices=[]):  # the throw-away weights draw nothing
                super().__init__(
                    conv.in_channels,
                    conv.out_channels,
                    conv.heads,
                    concat=conv.concat,
                    attention_dropout=conv.dropout,
                )
            self.lin = conv.lin
            self.att_src, self.att_dst = conv.att_src, conv.att_dst
            if conv.bias is not None:
                self.bias = conv.bias
            else:  # no bias: a zero that is neither trained nor saved
                del self._parameters["bias"]
                zero = torch.zeros(self.out_dim, dtype=conv.att_src.dtype)
                self.register_buffer("bias", zero.to(conv.att_src.device), persistent=False)
            self.res = conv.res
            self._part, self._index = part, index

        def forward(  # type: ignore[override]
            self,
            x: torch.Tensor,
            edge_index: Edges,
            edge_attr: torch.Tensor | None = None,
            size: tuple[int, int] | None = None,
            return_attention_weights: bool | None = None,
        ) -> torch.Tensor:
            """This rank's rows of ``GATConv(x, edge_index)``."""
            ctx = _context(
                self,
                "gat",
                x,
                edge_index,
                edge_attr=edge_attr,
                size=size,
                return_attention_weights=return_attention_weights,
                unweighted_adj=True,  # PyG's GATConv ignores the values of an adj_t
            )
            part = self._part
            out = super().forward(
                x, ctx, epoch=part.step, training=self.training, index=self._index
            )
            return out if self.res is None else out + self.res(x)

    return GATConvTwin


class BatchNormTwin(GraphBatchNorm):
    """``BatchNorm1d`` over every node of the graph, whichever rank holds it.

    Training normalises with the moments of all ranks' rows (all-reduced) and updates the
    running statistics as torch does; evaluation uses the running statistics.

    Args:
        bn: the torch module (``weight``, ``bias`` and the running statistics are taken over).
        part: the rank's part.
    """

    def __init__(self, bn: nn.BatchNorm1d | nn.SyncBatchNorm, part: PartGraph) -> None:
        super().__init__(bn.num_features, eps=bn.eps, momentum=bn.momentum)
        self.weight, self.bias = bn.weight, bn.bias
        self.running_mean, self.running_var = bn.running_mean, bn.running_var
        self.num_batches_tracked = bn.num_batches_tracked
        self.num_features = bn.num_features
        self._part = part

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, comm: Communicator | None = None
    ) -> torch.Tensor:
        """Normalise this rank's node rows ``x``."""
        self._part.check_rows(x, type(self).__name__)
        return super().forward(x, self._part.comm)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class HashedDropout(nn.Module):
    """``nn.Dropout`` with masks hashed from (seed, step, call index, global node id, column).

    Args:
        p: drop probability.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`fullgraph.pyg.dropout` of ``x``."""
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
