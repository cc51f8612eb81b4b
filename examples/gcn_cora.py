"""A two-layer GCN on Cora (Kipf & Welling), as a plain PyG script and on P ranks.

``gcn_cora.py`` is the single-process PyG script; ``gcn_cora_distributed.py`` is the same
script on P ranks (one process each, every rank ending with the one-process gradients)::

    python examples/gcn_cora.py --root ../shared/datasets
    mpirun -n 2 python examples/gcn_cora_distributed.py --root ../shared/datasets

They differ in these five lines of ``gcn_cora_distributed.py`` (each rank partitions the graph
in memory here; ``pyg.load_part("parts/cora-4")`` reads a partition directory instead)::

    from fullgraph import pyg
    data = pyg.load_part(T.NormalizeFeatures()(to_pyg(load("cora", args.root))))
    model = pyg.distribute(GCN(data.num_features, 16, data.num_classes, args.dropout), data)
    loss = pyg.loss(out, data)
    accs = [pyg.accuracy(pred, data, m) for m in masks]

Every rank prints the same (global) numbers.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch_geometric.nn import GCNConv

from fullgraph.datasets import load, to_pyg


class GCN(torch.nn.Module):
    """``conv2(dropout(relu(conv1(dropout(x)))))``.

    Args:
        in_channels: input features.
        hidden: hidden width.
        out_channels: classes.
        dropout: drop probability before each convolution.
    """

    def __init__(
        self, in_channels: int, hidden: int, out_channels: int, dropout: float = 0.5
    ) -> None:
        super().__init__()
        self.dropout = torch.nn.Dropout(dropout)
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits of every node."""
        x = F.relu(self.conv1(self.dropout(x), edge_index))
        return self.conv2(self.dropout(x), edge_index)


def main(argv: list[str] | None = None) -> list[float]:
    """Train for ``--epochs`` epochs, printing loss and accuracies; returns the losses."""
    parser = argparse.ArgumentParser(description="two-layer GCN on Cora")
    parser.add_argument("--root", required=True, help="dataset root holding cora/")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--dropout", type=float, default=0.5)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    data = T.NormalizeFeatures()(to_pyg(load("cora", args.root)))
    model = GCN(data.num_features, 16, data.num_classes, args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    masks = (data.train_mask, data.val_mask, data.test_mask)
    losses = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(dim=-1)
        accs = [int((pred[m] == data.y[m]).sum()) / int(m.sum()) for m in masks]
        shown = " ".join(f"{a:.4f}" for a in accs)
        print(f"epoch {epoch:03d} loss {loss.item():.6f} accuracy train/val/test {shown}")
    return losses


if __name__ == "__main__":
    main()
