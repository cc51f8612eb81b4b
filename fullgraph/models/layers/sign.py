"""SGC and SIGN: per-row linear layers on hops of the input features computed once.

- ``--model sgc`` (Wu et al., ICML 2019; PyG ``SGConv``): ``Y = (A^K X) W^T + b``, ``A`` GCN's
  ``D^-1/2 (A + I) D^-1/2`` by default, ``K = 2``. With ``--layers 1`` it is PyG's
  ``SGConv(F, C, K)``; more layers make an MLP on ``A^K X`` (ReLU and dropout between, as every
  stack).
- ``--model sign`` (Rossi et al., 2020; PyG's ``transforms.SIGN`` and ``examples/sign.py``):
  the inception layer, one linear layer per hop on ``[X, A X, ..., A^K X]`` side by side,
  concatenated (``(K + 1) H`` columns), then ReLU and dropout and the remaining
  ``--layers - 1`` linear layers; ``A`` is ``D^-1/2 A D^-1/2`` without self-loops by default
  (``sym``: the transform's), ``K = 3``. With ``--layers 1`` the one layer is a linear model of
  the concatenated hops (``(K + 1) F -> C``).

``--propagation`` picks the operator (``gcn``, ``mean``, ``sym``, or ``ppr``:
personalised-PageRank diffusion on GCN's with ``--alpha``, default 0.1); ``--hops`` ``K``. The
hops are computed once per partition, exactly on P ranks, and kept with it
(:mod:`fullgraph.propagation`); the first layer reads them as the precomputed aggregation
(:attr:`~fullgraph.models.layers.GraphLayer.hop_input`), the input dropout applied to them.

Distribution: after the hops every layer is per row (:class:`~fullgraph.models.layers.mlp.
MLPLayer`'s product: :func:`~fullgraph.models.mixed_linear.mixed_linear`), so training
exchanges nothing; the weight and bias gradients are per-block partials of the step's block
tree, the same bits at any rank count. ``--model sgc --layers 1 --propagation gcn`` exports
to PyG's ``SGConv(F, C, K)`` (which computes the hops from ``edge_index``); no PyG model equals
the other stacks (PyG's SIGN is a transform plus the user's model): their export is refused,
naming why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.layers.base import (
    DEFAULT_ALPHA,
    GraphLayer,
    LayerOptions,
    PygExport,
    register_layer,
)
from fullgraph.models.layers.mlp import MLPLayer
from fullgraph.models.mixed_linear import mixed_linear


def _hops_of(precomputed: torch.Tensor | None, kind: str) -> torch.Tensor:
    """The precomputed hops the first layer reads; a context without them is a caller's bug."""
    if precomputed is None:
        raise ValueError(
            f"--model {kind}: the first layer reads the precomputed hops (ctx.first_aggregate, "
            f"fullgraph.propagation.features.hop_features), which this context lacks"
        )
    return precomputed


@register_layer
class SGCLayer(MLPLayer):
    """``h W^T + b`` on every row, the first layer's ``h`` being ``A^K X``.

    Args:
        in_dim: input width.
        out_dim: output width.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]
    """

    kind = "sgc"
    accepts = ("hops", "propagation", "alpha")
    hop_input = "last"
    replay = "hops"
    pyg = PygExport(  # --layers 1 --propagation gcn only (export_pyg refuses the others)
        conv="SGConv", name="SGC", keys={"lin.weight": "lin.weight", "lin.bias": "lin.bias"}
    )
    #: ``K`` and the operator without ``--hops`` and ``--propagation``
    default_hops = 2
    default_propagation = "gcn"

    @classmethod
    def variant(cls, options: LayerOptions | None) -> type[GraphLayer]:
        """This class; ``--alpha`` only with ``--propagation ppr``.

        Raises:
            ConfigError: ``--alpha`` given for a propagation that does not teleport.
        """
        if options is not None and options.alpha is not None:
            propagation = options.propagation or cls.default_propagation
            if propagation != "ppr":
                raise ConfigError(
                    f"--alpha applies to --propagation ppr only, not --model {cls.kind} "
                    f"--propagation {propagation} (which does not teleport)"
                )
        return cls

    @classmethod
    def hop_options(cls, options: LayerOptions) -> tuple[str, int, float | None]:
        """``(propagation, K, alpha)``: the kind's defaults where ``options`` give none."""
        propagation = options.propagation or cls.default_propagation
        hops = options.hops if options.hops is not None else cls.default_hops
        alpha = None
        if propagation == "ppr":
            alpha = options.alpha if options.alpha is not None else DEFAULT_ALPHA
        return propagation, int(hops), alpha

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
        """``A^K X W^T + b`` (the first layer, ``precomputed`` = ``A^K X``) or ``h W^T + b``."""
        rows = _hops_of(precomputed, self.kind) if index == 0 else h
        return self.linear(rows, ctx)


@register_layer
class SIGNLayer(SGCLayer):
    """A linear layer after SIGN's inception layer (:class:`SIGNInception`, the first)."""

    kind = "sign"
    hop_input = "all"
    pyg = None
    export_note = (
        "PyG has no SIGN model (torch_geometric.transforms.SIGN only precomputes the hops, "
        "the model is the user's own)"
    )
    default_hops = 3
    default_propagation = "sym"

    @classmethod
    def build_first(
        cls, in_dim: int, width: int, *, last: bool, options: LayerOptions
    ) -> GraphLayer:
        """The inception layer over the ``K + 1`` hops of ``in_dim`` features each."""
        return SIGNInception(in_dim, width, cls.hop_options(options)[1], last=last)


class SIGNInception(GraphLayer):
    """SIGN's first layer on ``[X, A X, ..., A^K X]`` (``(K + 1) F`` columns side by side).

    Args:
        in_dim: ``F``, the features of one hop.
        width: ``H`` per hop (or ``C`` when it is the last layer).
        hops: ``K``.
        last: the stack's only layer: one linear layer ``(K + 1) F -> C`` of the concatenated
            hops instead of one per hop.

    Shapes:
        - precomputed hops: [num_inner, (K + 1) in_dim] -> [num_inner, (K + 1) width]
          (``last``: [num_inner, width])

    Attributes:
        lins: ``Linear(F, H)`` per hop (PyG's example's ``lins``), or one ``Linear((K + 1) F,
            C)`` when ``last``.
    """

    kind = "sign"
    fresh_input_grad = True
    precomputable = False
    reads_edges = False
    hop_input = "all"
    per_row = True

    def __init__(self, in_dim: int, width: int, hops: int, *, last: bool) -> None:
        out = width if last else (hops + 1) * width
        super().__init__(in_dim, out)
        self.num_hops, self.last = hops, last
        if last:
            self.lins = nn.ModuleList([nn.Linear((hops + 1) * in_dim, width)])
        else:
            self.lins = nn.ModuleList([nn.Linear(in_dim, width) for _ in range(hops + 1)])

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
        """Every hop's ``X_k W_k^T + b_k``, concatenated (``last``: one product)."""
        hops = _hops_of(precomputed, self.kind)
        dtype = ctx.plan.row_dtype
        if self.last:
            lin = self.lins[0]
            return mixed_linear(hops, lin.weight, dtype, lin.bias)
        f = self.in_dim
        outs = [
            mixed_linear(hops[:, k * f : (k + 1) * f], lin.weight, dtype, lin.bias)
            for k, lin in enumerate(self.lins)
        ]
        return torch.cat(outs, dim=1)

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, hops={self.num_hops}"
