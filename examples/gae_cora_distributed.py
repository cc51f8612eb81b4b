"""Link prediction on Cora as PyG's ``examples/link_pred.py`` writes it, on one process and P ranks.

``gae_cora.py`` is the single-process PyG script; ``gae_cora_distributed.py`` is the same
script on P ranks (one process each; every rank ends with the one-process gradients)::

    python examples/gae_cora.py --root ../shared/datasets
    mpirun -n 2 python examples/gae_cora_distributed.py --root ../shared/datasets

The model is PyG's: a two-layer GCN encoder, the dot-product decoder, binary cross-entropy
against fresh negatives every epoch (``negative_sampling``), ROC-AUC of the validation and test
pairs. Every split is encoded over the training graph (the GAE protocol of Kipf & Welling). The
two scripts differ in these five lines of ``gae_cora_distributed.py``::

    from fullgraph import pyg
    train_data, val_data, test_data = pyg.load_part(split(data))
    model = pyg.distribute(Net(data.num_features, 128, 64), train_data)
    neg_edge_index = pyg.negative_sampling(
    return float(roc_auc_score(*pyg.gather(data.edge_label, out)))

``pyg.negative_sampling`` draws hashed pairs (the same at any rank count) where PyG's draws
from torch's generator, so the two scripts' numbers differ; P ranks print what one rank prints,
to the last bit. Every rank prints the same (global) numbers.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch_geometric.transforms as T
from sklearn.metrics import roc_auc_score
from torch_geometric.nn import GCNConv

from fullgraph import pyg
from fullgraph.datasets import load, to_pyg


class Net(torch.nn.Module):
    """PyG's ``examples/link_pred.py``: a GCN encoder and the dot-product decoder.

    Args:
        in_channels: input features.
        hidden_channels: width of the first layer.
        out_channels: width of the node embeddings.
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def encode(self, x, edge_index):
        """Node embeddings."""
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)

    def decode(self, z, edge_label_index):
        """One score per pair: the dot product of its two embeddings."""
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)


def main(argv: list[str] | None = None) -> tuple[list[float], list[float]]:
    """Train for ``--epochs`` epochs, printing loss and AUCs; returns the losses and the
    validation and test AUC of every epoch (interleaved)."""
    parser = argparse.ArgumentParser(description="GAE link prediction on Cora")
    parser.add_argument("--root", required=True, help="dataset root holding cora/")
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    random.seed(0)  # RandomLinkSplit draws its held-out negatives from Python's random
    split = T.RandomLinkSplit(
        num_val=0.05, num_test=0.1, is_undirected=True, add_negative_train_samples=False
    )
    data = T.NormalizeFeatures()(to_pyg(load("cora", args.root)))
    train_data, val_data, test_data = pyg.load_part(split(data))
    model = pyg.distribute(Net(data.num_features, 128, 64), train_data)
    optimizer = torch.optim.Adam(params=model.parameters(), lr=0.01)
    criterion = torch.nn.BCEWithLogitsLoss()

    def train() -> float:
        model.train()
        optimizer.zero_grad()
        z = model.encode(train_data.x, train_data.edge_index)
        # A new round of negative sampling every epoch:
        neg_edge_index = pyg.negative_sampling(
            edge_index=train_data.edge_index,
            num_nodes=train_data.num_nodes,
            num_neg_samples=train_data.edge_label_index.size(1),
            method="sparse",
        )
        edge_label_index = torch.cat([train_data.edge_label_index, neg_edge_index], dim=-1)
        edge_label = torch.cat(
            [train_data.edge_label, train_data.edge_label.new_zeros(neg_edge_index.size(1))],
            dim=0,
        )
        out = model.decode(z, edge_label_index).view(-1)
        loss = criterion(out, edge_label)
        loss.backward()
        optimizer.step()
        return loss.item()

    @torch.no_grad()
    def test(data) -> float:
        model.eval()
        z = model.encode(train_data.x, train_data.edge_index)  # the training graph (GAE)
        out = model.decode(z, data.edge_label_index).view(-1).sigmoid()
        return float(roc_auc_score(*pyg.gather(data.edge_label, out)))

    losses, aucs = [], []
    for epoch in range(1, args.epochs + 1):
        loss = train()
        val_auc, test_auc = test(val_data), test(test_data)
        losses.append(loss)
        aucs += [val_auc, test_auc]
        print(f"epoch {epoch:03d} loss {loss:.6f} AUC val {val_auc:.4f} test {test_auc:.4f}")
    return losses, aucs


if __name__ == "__main__":
    main()
