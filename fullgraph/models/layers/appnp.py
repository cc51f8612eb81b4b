"""APPNP (Klicpera et al., ICLR 2019; PyG ``APPNP(K, alpha)``): predict, then propagate.

The stack's layers are per-row linears (:class:`~fullgraph.models.layers.mlp.MLPLayer`: an MLP,
as in the paper and PyG's ``examples/appnp.py``, with the stack's ReLU, dropout, ``--norm`` and
``--residual`` between them). The last layer's output ``H`` is then propagated ``K`` steps of
personalised PageRank on the GCN operator ``Â = D^-1/2 (A + I) D^-1/2`` (GLOBAL in-degrees
plus the self-loop, as GCN's):

    Z_0 = H,    Z_k = (1 - alpha) Â Z_(k-1) + alpha H,    output Z_K

with ``K = --hops`` (default 10) and ``alpha = --alpha`` (default 0.1), the order of PyG's
``APPNP.forward`` (``x * (1 - alpha)``, then ``+ alpha * h``). The propagation is part of the
last layer, so ``--residual`` adds the last layer's input after it (as the export does).

Distribution: every step is one :meth:`~fullgraph.models.context.GraphContext.aggregate`
(:class:`~fullgraph.distributed.halo.HaloAggregate`: the halo rows of ``Z_(k-1)``, class-wide,
from their owners; every row summed in ascending global id of its sources forward and in
``A^T dY`` backward), and the rest is per row, so ``Z_K`` and every gradient have the same
bits at any rank count; the linears' weight and bias gradients go through the block tree
(:mod:`~fullgraph.models.layers.mlp`). Training runs the propagation under autograd, end to end.

Memory: the propagation is linear in ``H`` and nothing in it keeps a tensor for the backward
pass (the aggregation saves none, the scalings none), so no ``Z_k`` is kept: ``K`` steps cost
``K`` exchanges each way, not ``K`` activations. Alive while it runs: ``H``, ``alpha H``,
``Z_(k-1)`` and ``Â Z_(k-1)`` (scaled and shifted in place into ``Z_k``; ``4 n C`` floats, ``C``
the classes) with the exchange's buffers; backward the output gradient of a step, its scaled
copy, ``Â^T`` of it and the sum of ``alpha H``'s gradients (``4 n C``). No receptive-field pruning
(the ``K`` steps would each need their own restricted operator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fullgraph.config import check_alpha, check_number
from fullgraph.kernels import CSRMatrix
from fullgraph.models.context import GraphContext
from fullgraph.models.layers.base import (
    DEFAULT_ALPHA,
    GraphLayer,
    LayerOptions,
    PygExport,
    register_layer,
)
from fullgraph.models.layers.gcn import GCNLayer
from fullgraph.models.layers.mlp import MLPLayer

if TYPE_CHECKING:
    from fullgraph.partition import Partition

#: PyG's ``examples/appnp.py`` and the paper: ``K = 10`` steps (teleport: ``DEFAULT_ALPHA``).
DEFAULT_HOPS = 10


def propagation_steps(options: LayerOptions) -> tuple[int, float]:
    """``(K, alpha)`` of ``options``, the defaults where unset.

    Raises:
        ConfigError: ``K`` not a positive integer, ``alpha`` outside (0, 1].
    """
    hops = DEFAULT_HOPS if options.hops is None else options.hops
    alpha = DEFAULT_ALPHA if options.alpha is None else options.alpha
    check_number("--hops", hops, low=1, integer=True)
    check_alpha("--alpha", alpha)
    return int(hops), float(alpha)


def ppr_propagate(h: torch.Tensor, ctx: GraphContext, hops: int, alpha: float) -> torch.Tensor:
    """``Z_K`` of ``Z_0 = h, Z_k = (1 - alpha) Â Z_(k-1) + alpha h`` over this rank's rows,
    differentiable (``ctx.aggregate`` per step, the rest per row in place).

    Args:
        h: this rank's rows of ``H``, float [num_inner, C].
        ctx: the rank's context (its operator: ``Â``).
        hops: ``K`` >= 1.
        alpha: the teleport probability.

    Returns:
        A new tensor, float [num_inner, C].
    """
    teleport = h * alpha
    z = h
    for _ in range(hops):
        # HaloAggregate's output is new and saved by nobody: scaled and shifted in place
        z = ctx.aggregate(z).mul_(1.0 - alpha).add_(teleport)
    return z


@register_layer
class APPNPLayer(MLPLayer):
    """A per-row linear; the last of a stack then propagates its output (see the module).

    Args:
        in_dim: input width.
        out_dim: output width.
        hops: propagation steps after the linear (0: none, a hidden layer).
        alpha: the teleport probability.

    Shapes:
        - input: [num_inner, in_dim] -> [num_inner, out_dim]
    """

    kind = "appnp"
    precomputable = False
    reads_edges = False
    prunable = False  # K steps of one operator: pruning would need K restricted ones
    per_row = False  # the propagation after the last layer reads every row
    self_loops = True  # the GCN operator (the memory model replays its set-up)
    accepts = ("hops", "alpha")
    pyg = PygExport(  # PyG has no model of an MLP and APPNP under ``convs``
        conv="APPNP",
        name="APPNP",
        keys={"weight": "lin.weight", "bias": "lin.bias"},
    )

    def __init__(self, in_dim: int, out_dim: int, hops: int = 0, alpha: float = DEFAULT_ALPHA):
        super().__init__(in_dim, out_dim)
        self.hops, self.alpha = hops, alpha

    @classmethod
    def build(cls, in_dim: int, width: int, *, last: bool, options: LayerOptions) -> GraphLayer:
        """A linear; the last layer propagates ``K`` steps (:func:`propagation_steps`)."""
        hops, alpha = propagation_steps(options)
        return cls(in_dim, width, hops if last else 0, alpha)

    @classmethod
    def variant(cls, options: LayerOptions | None) -> type[GraphLayer]:
        """This class; ``options``' ``K`` and ``alpha`` checked (:func:`propagation_steps`)."""
        propagation_steps(options or LayerOptions())
        return cls

    @staticmethod
    def operator(part: Partition, options: LayerOptions) -> CSRMatrix:
        """``D^-1/2 (A + I) D^-1/2`` over the rank's rows (GCN's, unweighted)."""
        return GCNLayer.operator(part, LayerOptions())

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
        """``h W^T + b``, then (the last layer) :func:`ppr_propagate`."""
        y = self.linear(h, ctx)
        if self.hops == 0:
            return y
        return ppr_propagate(y, ctx, self.hops, self.alpha)

    def extra_repr(self) -> str:
        extra = f", K={self.hops}, alpha={self.alpha:g}" if self.hops else ""
        return f"{self.in_dim}, {self.out_dim}{extra}"
