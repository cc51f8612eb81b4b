"""The base class of the layer kinds, the registry they enter by name, and what a kind
declares besides its maths: the options it takes (:attr:`GraphLayer.accepts`), its operator
built from a part (:meth:`GraphLayer.operator`), its export to PyG (:class:`PygExport`) and how
the memory model replays it (:attr:`GraphLayer.replay`, :attr:`GraphLayer.self_loops`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.kernels import CSRMatrix, spmm
from fullgraph.models.context import GraphContext

if TYPE_CHECKING:
    from fullgraph.partition import Partition

#: The operators of ``--propagation`` (the hops of SGC and SIGN): ``gcn`` = ``D^-1/2 (A + I)
#: D^-1/2``, ``mean`` = the mean over incoming neighbours, ``ppr`` = personalised-PageRank
#: diffusion ``X_k = (1 - alpha) Â X_(k-1) + alpha X`` on the ``gcn`` operator, ``sym`` =
#: ``D^-1/2 A D^-1/2`` without self-loops (PyG's ``transforms.SIGN``).
PROPAGATIONS = ("gcn", "mean", "ppr", "sym")

#: The teleport probability of personalised-PageRank propagation when ``--alpha`` is not given
#: (APPNP's published default; ``appnp`` and ``--propagation ppr``).
DEFAULT_ALPHA = 0.1

#: Registered layer kinds by name.
LAYERS: dict[str, type[GraphLayer]] = {}


def register_layer(cls: type[GraphLayer]) -> type[GraphLayer]:
    """Class decorator: make ``cls`` available as ``--model cls.kind``."""
    LAYERS[cls.kind] = cls
    return cls


@dataclass(frozen=True)
class LayerOptions:
    """Options of the layer kinds that have them (the others ignore them; the options a kind
    takes are its :attr:`GraphLayer.accepts`, :func:`~fullgraph.models.layers.check_options`
    refuses the others on the command line).

    Attributes:
        edge_weight: weigh the edges with the part's stored edge weights (GCN: global weighted
            degrees).
        improved: self-loop fill 2 (GCN; PyG ``improved=True``).
        heads: attention heads of the hidden layers (GAT; concatenated).
        output_heads: attention heads of the last layer (GAT; averaged).
        attention_dropout: drop probability of the attention coefficients (GAT).
        aggr: the neighbour aggregation, ``mean``, ``sum`` or ``max`` (SAGE, GraphConv);
            ``None``: the kind's default (:meth:`GraphLayer.variant` resolves it).
        hops: propagation steps (APPNP's K) or hops of precomputed features (SGC's and
            SIGN's ``A^k X``); ``None``: the kind's default.
        alpha: teleport probability of personalised-PageRank propagation, in (0, 1]
            (APPNP, and the ``ppr`` propagation); ``None``: the kind's default.
        propagation: the operator the hops apply (:data:`PROPAGATIONS`); ``None``: the
            kind's default.
    """

    edge_weight: bool = False
    improved: bool = False
    heads: int = 1
    output_heads: int = 1
    attention_dropout: float = 0.0
    aggr: str | None = None
    hops: int | None = None
    alpha: float | None = None
    propagation: str | None = None


#: The init arguments of an exported model (:func:`fullgraph.training.export_pyg.init_args`).
ExportArgs = Mapping[str, int | float | str | None]


@dataclass(frozen=True)
class PygExport:
    """How a layer kind exports to PyG (:mod:`fullgraph.training.export_pyg`).

    Attributes:
        conv: PyG's layer, as ``FullgraphGNN`` builds it for the kind (``GCNConv``).
        name: how an export names a model of the kind (``GraphSAGE``).
        keys: PyG's ``state_dict`` key under ``convs.i.`` -> ours under ``layers.i.``.
        basic_gnn: PyG's own model of these layers (``torch_geometric.nn.models.GCN``'s
            ``GCN``), or ``None``: PyG has none.
        basic_kwargs: the kind's own arguments of that model, from the export's init args (the
            function returns ``None`` where the model would not give the same logits);
            ``None``: the model takes none.
        not_exported: the kind's options an export cannot carry yet (refused, naming them).
    """

    conv: str
    name: str
    keys: Mapping[str, str]
    basic_gnn: str | None = None
    basic_kwargs: Callable[[ExportArgs], dict[str, int | str | bool] | None] | None = None
    not_exported: tuple[str, ...] = ()


class GraphLayer(nn.Module):
    """One message-passing layer on a rank's rows: ``[num_inner, in_dim] -> [num_inner, out]``.

    Args:
        in_dim: input width.
        out_dim: output width (what the next layer receives).

    Class attributes:
        kind: the name the layer is registered under (``--model``).
        precomputable: the layer's aggregation of its input does not depend on its parameters,
            so the first layer's aggregation of the static features may be computed once.
        fresh_input_grad: the layer's input is used by this layer alone, which returns its
            gradient as a new tensor, so the activation before it may work in place.
        prunable: the layer's output row depends on that row's in-neighbours only, through
            ``ctx.layer_graph`` (so training may restrict it to the rows the loss reaches,
            :mod:`fullgraph.distributed.receptive_field`).
        per_row: every output row is a function of that row's input alone (no operator: MLP,
            SGC's and SIGN's layers on their precomputed hops), so a training step may run on
            the rows the loss reads alone (:mod:`fullgraph.training.train_rows`).
        root_term: the body adds a root term ``h R^T`` (SAGE, GIN), so it keeps its input in
            either order (the memory model reads it).
        row_mlp: after the body, a ReLU in place and a linear layer ``out -> out`` per row
            (GIN's MLP; the memory model reads it).
        accepts: the :class:`LayerOptions` this kind takes (``--edge-weight``, ``--heads``...);
            the command line refuses the others.
        pyg: its export to PyG, or ``None``: it has no PyG layer.
        replay: how the memory model replays the stack (:mod:`fullgraph.memory.model`):
            ``linear`` (:func:`~fullgraph.models.graph_linear.graph_linear` on an operator),
            ``attention`` (GAT) or ``max`` (the maximum over neighbours); ``None``: it does
            not (``fullgraph plan`` refuses the kind).
        self_loops: the operator adds a self-loop to every row (GCN; the memory model replays
            the loops, the normalisation and the sort by column they need).
        reads_edges: the stack reads the part's edges itself (``ctx.structure``: attention,
            the maximum over neighbours); ``None``: exactly when not :attr:`precomputable`.
        hop_input: the first layer reads precomputed hops of the input features instead of
            aggregating (``last``: ``A^K X`` alone, SGC; ``all``: ``[X, A X, ..., A^K X]``
            side by side, SIGN; :meth:`hop_options` says which), computed once by
            :mod:`fullgraph.propagation` or read from the partition's cache; the input
            dropout applies to them. ``None``: it does not.
        export_note: why the kind has no PyG export (``pyg`` is ``None``), for the refusal.
    """

    kind: ClassVar[str] = ""
    precomputable: ClassVar[bool] = True
    fresh_input_grad: ClassVar[bool] = False
    prunable: ClassVar[bool] = False
    per_row: ClassVar[bool] = False
    root_term: ClassVar[bool] = False
    row_mlp: ClassVar[bool] = False
    accepts: ClassVar[tuple[str, ...]] = ()
    pyg: ClassVar[PygExport | None] = None
    replay: ClassVar[str | None] = None
    self_loops: ClassVar[bool] = False
    reads_edges: ClassVar[bool | None] = None
    hop_input: ClassVar[str | None] = None
    export_note: ClassVar[str] = ""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim

    @classmethod
    def build(cls, in_dim: int, width: int, *, last: bool, options: LayerOptions) -> GraphLayer:
        """The layer of a stack: ``width`` outputs (per head for the kinds that have heads).

        Args:
            in_dim: input width.
            width: the stack's width at this layer (hidden, or classes for the last layer).
            last: the last layer of the stack.
            options: per-kind options.
        """
        return cls(in_dim, width)

    @classmethod
    def build_first(
        cls, in_dim: int, width: int, *, last: bool, options: LayerOptions
    ) -> GraphLayer:
        """The first layer of a stack (default: :meth:`build`; SIGN's inception layer)."""
        return cls.build(in_dim, width, last=last, options=options)

    @classmethod
    def hop_options(cls, options: LayerOptions) -> tuple[str, int, float | None]:
        """``(propagation, K, alpha)`` of the hops a :attr:`hop_input` kind reads under
        ``options``, its defaults resolved (``alpha`` ``None`` but for ``ppr``)."""
        raise NotImplementedError(f"--model {cls.kind} reads no precomputed hops")

    @classmethod
    def variant(cls, options: LayerOptions | None) -> type[GraphLayer]:
        """The class whose operator and traits (:attr:`precomputable`, :attr:`prunable`, ...)
        a stack of this kind has under ``options``: ``cls`` itself but for the kinds whose
        options change them (SAGE's and GraphConv's ``aggr``)."""
        return cls

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """The normalised aggregation operator of this kind on the part's rows.

        Args:
            part: the part (its local CSR of incoming edges, :func:`~fullgraph.models.
                local_graph.local_csr`, GLOBAL in-degrees, and stored edge values).
            options: the layer options (the kind reads those it accepts).

        Returns:
            The operator with its values, rows = inner nodes, columns = local ids.

        Raises:
            ConfigError: ``options`` ask for what the part does not hold.
        """
        raise NotImplementedError

    @staticmethod
    def part_check(options: LayerOptions) -> Callable[[Partition], None] | None:
        """The check of a part this kind makes under ``options`` before training starts (on
        every rank, agreed before any collective of the set-up), or ``None``: none."""
        return None

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
        """The layer's output for input ``h`` (dense, or CSR for sparse input features).

        Args:
            h: this rank's input rows.
            ctx: the rank's :class:`~fullgraph.models.context.GraphContext`.
            precomputed: the aggregation of ``h`` computed once (first layer, no dropout).
            epoch: the epoch (keys the layer's own random draws, e.g. attention dropout).
            training: apply the layer's own dropout.
            index: the layer's position in the stack (keys its random draws).
            rebuild: recomputes ``h`` when ``h`` is a constant (the dropped input features),
                so that a layer may recompute it in its backward pass instead of keeping it;
                a layer may ignore it.
        """
        raise NotImplementedError


def times_weight(h: torch.Tensor | CSRMatrix, weight: torch.Tensor) -> torch.Tensor:
    """``h @ weight.T`` for dense or CSR ``h``."""
    if isinstance(h, CSRMatrix):
        return spmm(h, weight.t())
    return F.linear(h, weight)
