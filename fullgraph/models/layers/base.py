"""The base class of the layer kinds and the registry they enter by name."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.kernels import CSRMatrix, spmm
from fullgraph.models.context import GraphContext

#: Registered layer kinds by name.
LAYERS: dict[str, type[GraphLayer]] = {}


def register_layer(cls: type[GraphLayer]) -> type[GraphLayer]:
    """Class decorator: make ``cls`` available as ``--model cls.kind``."""
    LAYERS[cls.kind] = cls
    return cls


class GraphLayer(nn.Module):
    """One message-passing layer on a rank's rows: ``[num_inner, in_dim] -> [num_inner, out]``.

    Args:
        in_dim: input width.
        out_dim: output width.
    """

    kind: ClassVar[str] = ""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim

    @staticmethod
    def operator(base: CSRMatrix, degree: torch.Tensor, num_inner: int) -> CSRMatrix:
        """The normalised aggregation operator of this kind.

        Args:
            base: the part's local CSR of incoming edges (rows = inner nodes, columns = local
                ids, no values).
            degree: GLOBAL in-degree of every local node, int64 [num_local].
            num_inner: number of inner nodes (rows).

        Returns:
            The operator with its values, rows = inner nodes.
        """
        raise NotImplementedError

    def forward(
        self,
        h: torch.Tensor | CSRMatrix,
        ctx: GraphContext,
        precomputed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The layer's output for input ``h`` (dense, or CSR for sparse input features).

        Args:
            h: this rank's input rows.
            ctx: the rank's :class:`~fullgraph.models.context.GraphContext`.
            precomputed: the aggregation of ``h`` computed once (first layer, no dropout).
        """
        raise NotImplementedError

    @property
    def decayed_parameters(self) -> list[nn.Parameter]:
        """The parameters weight decay applies to when it covers this layer."""
        return list(self.parameters())


def times_weight(h: torch.Tensor | CSRMatrix, weight: torch.Tensor) -> torch.Tensor:
    """``h @ weight.T`` for dense or CSR ``h``."""
    if isinstance(h, CSRMatrix):
        return spmm(h, weight.t())
    return F.linear(h, weight)


def aggregate_linear(
    lin: nn.Linear, h: torch.Tensor | CSRMatrix, ctx: GraphContext, precomputed: torch.Tensor | None
) -> torch.Tensor:
    """``A (h W^T) + b``, transforming before aggregating when that narrows the exchange.

    Both orders give the same result up to rounding; the narrower one (``out <= in``)
    exchanges fewer bytes. ``precomputed`` (``A h`` computed once) skips the aggregation.
    """
    if precomputed is not None:
        return lin(precomputed)
    if lin.out_features <= lin.in_features:
        return ctx.aggregate(times_weight(h, lin.weight)) + lin.bias
    return lin(ctx.aggregate(h))
