"""GraphSAGE with BatchNorm, written once for one process and P ranks.

The model calls :func:`fullgraph.pyg.dropout` where a PyG model calls ``F.dropout``: inside a
model converted by :func:`fullgraph.pyg.distribute` its masks are hashed from the global node
ids (P ranks drop what one process drops), elsewhere it is ``F.dropout``. Its ``BatchNorm``
layers take their moments over every node of the graph, whichever rank holds it::

    python examples/sage_batchnorm.py --root ../shared/datasets
    mpirun -n 2 python examples/sage_batchnorm.py --root ../shared/datasets
    mpirun -n 4 python examples/sage_batchnorm.py --parts parts/cora-4
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.nn import BatchNorm, SAGEConv

from fullgraph import pyg
from fullgraph.datasets import load, to_pyg


class SAGEBatchNorm(torch.nn.Module):
    """``lin(relu(bn2(sage2(drop(relu(bn1(sage1(drop(x)))))))))``, mean aggregation.

    ``bn1`` is PyG's ``BatchNorm``, ``bn2`` torch's ``BatchNorm1d`` (both are converted).

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
        self.p = dropout
        self.conv1 = SAGEConv(in_channels, hidden)
        self.bn1 = BatchNorm(hidden)
        self.conv2 = SAGEConv(hidden, hidden)
        self.bn2 = torch.nn.BatchNorm1d(hidden)
        self.lin = torch.nn.Linear(hidden, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits of every node."""
        x = pyg.dropout(x, self.p, self.training)
        x = F.relu(self.bn1(self.conv1(x, edge_index)))
        x = pyg.dropout(x, self.p, self.training)
        x = F.relu(self.bn2(self.conv2(x, edge_index)))
        return self.lin(x)


def main(argv: list[str] | None = None) -> None:
    """Train on this rank's part of Cora (``--root``) or of a partition (``--parts``)."""
    parser = argparse.ArgumentParser(description="GraphSAGE with BatchNorm on P ranks")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--root", help="dataset root holding cora/ (partitioned in memory)")
    where.add_argument("--parts", help="a partition directory (fullgraph partition)")
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    data = pyg.load_part(args.parts or to_pyg(load("cora", args.root)))
    model = pyg.distribute(SAGEBatchNorm(data.num_features, 64, data.num_classes), data)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        loss = pyg.loss(model(data.x, data.edge_index), data)
        loss.backward()  # ends with the gradients summed over the ranks
        optimizer.step()
        model.eval()
        with torch.no_grad():
            out = model(data.x, data.edge_index)
        val, test = pyg.accuracy(out, data, data.val_mask), pyg.accuracy(out, data, data.test_mask)
        print(f"epoch {epoch:03d} loss {loss.item():.6f} val {val:.4f} test {test:.4f}")


if __name__ == "__main__":
    main()
