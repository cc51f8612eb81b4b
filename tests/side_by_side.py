"""Training our model and a plain PyG reference side by side, for the parity tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from fullgraph.datasets import Graph, to_pyg


class PygStack(torch.nn.Module):
    """A plain PyG model: the given convolutions with ReLU between them."""

    def __init__(self, convs: Iterable[torch.nn.Module]) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def losses_side_by_side(
    trainer: Any, ref: torch.nn.Module, graph: Graph, epochs: int = 5
) -> tuple[list[float], list[float]]:
    """``epochs`` training steps of ``trainer`` and of the PyG model ``ref`` (its ``convs``:
    Adam at the trainer's rate, the trainer's weight decay on the first conv only).

    Returns:
        The two loss sequences, ours first.
    """
    cfg = trainer.config
    first = list(ref.convs[0].parameters())
    rest = [p for c in ref.convs[1:] for p in c.parameters()]
    opt = torch.optim.Adam(
        [{"params": first, "weight_decay": cfg.weight_decay}, {"params": rest}], lr=cfg.lr
    )
    data = to_pyg(graph)
    train = torch.from_numpy(graph.train_mask)
    y = torch.from_numpy(graph.y)
    ours, theirs = [], []
    for epoch in range(1, epochs + 1):
        ours.append(trainer.train_step(epoch).loss)
        opt.zero_grad()
        loss = F.cross_entropy(ref(data.x, data.edge_index)[train], y[train])
        loss.backward()
        opt.step()
        theirs.append(float(loss.detach()))
    return ours, theirs
