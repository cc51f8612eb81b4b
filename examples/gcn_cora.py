"""GCN or GAT on Cora, written as PyG's own examples write them, on one process and on P ranks.

``gcn_cora.py`` is the single-process PyG script; ``gcn_cora_distributed.py`` is the same
script on P ranks (one process each, every rank ending with the one-process gradients)::

    python examples/gcn_cora.py --root ../shared/datasets [--model gat]
    mpirun -n 2 python examples/gcn_cora_distributed.py --root ../shared/datasets [--model gat]

The models are those of PyG's ``examples/gcn.py`` and ``examples/gat.py``, their
``F.dropout(x, p, training=self.training)`` calls included: inside a distributed model those
draw masks hashed from the global node ids, so P ranks drop what one process drops. The two
scripts differ in these five lines of ``gcn_cora_distributed.py`` (each rank partitions the
graph in memory here; ``pyg.load_part("parts/cora-4")`` reads a partition directory instead)::

    from fullgraph import pyg
    data = pyg.load_part(T.NormalizeFeatures()(to_pyg(load("cora", args.root))))
    model = pyg.distribute(build(args.model, data.num_features, data.num_classes, p), data)
    loss = pyg.loss(out, data)
    accs = [pyg.accuracy(pred, data, m) for m in masks]

Every rank prints the same (global) numbers.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch_geometric.nn import GATConv, GCNConv

from fullgraph.datasets import load, to_pyg


class GCN(torch.nn.Module):
    """PyG's ``examples/gcn.py``: ``conv2(dropout(relu(conv1(dropout(x)))))``.

    Args:
        in_channels: input features.
        hidden_channels: hidden width.
        out_channels: classes.
        dropout: drop probability before each convolution.
    """

    def __init__(
        self, in_channels: int, hidden_channels: int, out_channels: int, dropout: float = 0.5
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv2(x, edge_index, edge_weight)
        return x


class GAT(torch.nn.Module):
    """PyG's ``examples/gat.py``: ``conv2(dropout(elu(conv1(dropout(x)))))``, attention dropout.

    Args:
        in_channels: input features.
        hidden_channels: width of every head of the first layer.
        out_channels: classes.
        heads: heads of the first layer (concatenated; the second has one).
        dropout: drop probability of the inputs of both layers and of their attention.
    """

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        heads: int = 8,
        dropout: float = 0.6,
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=dropout)
        self.conv2 = GATConv(
            hidden_channels * heads, out_channels, heads=1, concat=False, dropout=dropout
        )

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.conv2(x, edge_index)
        return x


def build(name: str, in_channels: int, out_channels: int, dropout: float) -> torch.nn.Module:
    """PyG's recipe for ``name``: GCN 16 hidden, GAT 8 heads of 8."""
    if name == "gat":
        return GAT(in_channels, 8, out_channels, heads=8, dropout=dropout)
    return GCN(in_channels, 16, out_channels, dropout)


def main(argv: list[str] | None = None) -> list[float]:
    """Train for ``--epochs`` epochs, printing loss and accuracies; returns the losses."""
    parser = argparse.ArgumentParser(description="two-layer GCN or GAT on Cora")
    parser.add_argument("--root", required=True, help="dataset root holding cora/")
    parser.add_argument("--model", choices=("gcn", "gat"), default="gcn")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--dropout", type=float, help="default 0.5 (gcn), 0.6 (gat)")
    args = parser.parse_args(argv)
    p = args.dropout if args.dropout is not None else {"gcn": 0.5, "gat": 0.6}[args.model]

    torch.manual_seed(0)
    data = T.NormalizeFeatures()(to_pyg(load("cora", args.root)))
    model = build(args.model, data.num_features, data.num_classes, p)
    lr = {"gcn": 0.01, "gat": 0.005}[args.model]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
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
