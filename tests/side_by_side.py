"""Training our model and a plain PyG reference side by side, for the parity tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fullgraph.datasets import Graph, to_pyg


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
