"""Link decoders: a score per node pair from the two nodes' embeddings.

- ``dot``: ``<h_u, h_v>`` (GAE, Kipf & Welling 2016), no parameters;
- ``mlp``: OGB's ``LinkPredictor`` (the linkproppred examples): the Hadamard product
  ``h_u * h_v``, then ``layers`` linears with ReLU between, the last to one logit.

Both return the logit (OGB's predictor applies a sigmoid and takes ``-log(p + 1e-15)``; the
trainer takes binary cross-entropy with logits, the same minimiser without the 1e-15). The
MLP's products are :func:`~fullgraph.models.mixed_linear.mixed_linear`: inside a training
step whose pair tree is in force their weight and bias gradients are per-block partials
over the pairs' rows (the same bits at any rank count), and bfloat16 under bf16-mixed.
Every operation reads one pair's row alone, so a pair's score is the same wherever it is
computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.models.gnn import GNN
from fullgraph.models.mixed_linear import mixed_linear

#: The decoders ``--decoder`` names.
DECODERS = ("dot", "mlp")


class DotDecoder(nn.Module):
    """``<h_u, h_v>`` per pair."""

    kind = "dot"

    def forward(
        self, hu: torch.Tensor, hv: torch.Tensor, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Logits [m] of the pairs' rows ``hu``, ``hv`` [m, d]."""
        return (hu * hv).sum(-1)


class MLPDecoder(nn.Module):
    """OGB's ``LinkPredictor``: ``MLP(h_u * h_v)`` with ``layers`` linears.

    Args:
        in_dim: the embeddings' width.
        hidden: the hidden linears' width.
        layers: linears (>= 1; the last gives one logit).
    """

    kind = "mlp"

    def __init__(self, in_dim: int, hidden: int, layers: int = 3) -> None:
        super().__init__()
        if layers < 1:
            raise ConfigError(f"--decoder-layers must be >= 1, got {layers}")
        widths = [in_dim] + [hidden] * (layers - 1) + [1]
        self.lins = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)
        )

    def forward(
        self, hu: torch.Tensor, hv: torch.Tensor, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """Logits [m] of the pairs' rows ``hu``, ``hv`` [m, d] (``dtype``: the products'
        dtype under bf16-mixed, else ``None``)."""
        x = hu * hv
        for lin in self.lins[:-1]:
            x = F.relu(mixed_linear(x, lin.weight, dtype, lin.bias, rows=True))
        last = self.lins[-1]
        return mixed_linear(x, last.weight, dtype, last.bias, rows=True).squeeze(-1)


def build_decoder(kind: str, in_dim: int, hidden: int, layers: int) -> nn.Module:
    """The decoder ``--decoder`` names.

    Raises:
        ConfigError: an unknown kind.
    """
    if kind == "dot":
        return DotDecoder()
    if kind == "mlp":
        return MLPDecoder(in_dim, hidden, layers)
    raise ConfigError(f"--decoder {kind!r}: choose one of {', '.join(DECODERS)}")


class LinkModel(nn.Module):
    """The encoder and the decoder of a link-prediction run.

    Attributes:
        encoder: the layer stack (``layers`` is its).
        decoder: the pair scorer.
    """

    def __init__(self, encoder: GNN, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    @property
    def layers(self) -> nn.ModuleList:
        """The encoder's layers (the first one's weight decay group)."""
        return self.encoder.layers
