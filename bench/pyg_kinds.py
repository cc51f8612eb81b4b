"""Accuracy of the newer PyG layers through ``fullgraph.pyg`` against plain PyG, same script.

One script, two ways: ``--plain`` trains a PyG model on the whole graph in one process (no
fullgraph in the loop); without it, the same model goes through ``pyg.load_part`` /
``pyg.distribute`` on however many ranks ``mpirun`` starts. Models (2 layers, 64 hidden,
dropout 0.5 with ``F.dropout`` as PyG's examples write it, Adam lr 0.01, weight decay 5e-4,
200 epochs, seed 0): ``gin`` (``GINConv`` with a 2-layer MLP, ``train_eps``), ``graphconv-max``
(``GraphConv(aggr="max")``), ``sage-max`` (``SAGEConv(aggr="max")``), ``gcn-improved``
(``GCNConv(improved=True)`` with the graph's edge weights: all ones on the real datasets, so
their weighted path with ``improved``'s self-loop weight 2), ``gcn-weighted`` (``GCNConv`` with
the dataset's edge weights, for a dataset that has them). Prints the test accuracy at the best
validation epoch (rank 0).

    python -m bench.pyg_kinds --dataset cora --root ../shared/datasets --model gin --plain
    mpirun -n 2 python -m bench.pyg_kinds --dataset cora --root ../shared/datasets --model gin
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def build(name: str, f: int, c: int, hidden: int = 64) -> nn.Module:
    """The two-layer model ``name`` (see the module docstring)."""
    from torch_geometric.nn import GCNConv, GINConv, GraphConv, SAGEConv

    def conv(i: int, o: int) -> nn.Module:
        if name == "gin":
            return GINConv(
                nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o)), train_eps=True
            )
        if name == "graphconv-max":
            return GraphConv(i, o, aggr="max")
        if name == "sage-max":
            return SAGEConv(i, o, aggr="max")
        return GCNConv(i, o, improved=name == "gcn-improved")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = conv(f, hidden), conv(hidden, c)

        def forward(self, x, edge_index, edge_weight=None):
            kw = {} if edge_weight is None else {"edge_weight": edge_weight}
            x = F.dropout(x, p=0.5, training=self.training)
            x = self.conv1(x, edge_index, **kw).relu()
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index, **kw)

    return Net()


def main(argv: list[str] | None = None) -> int:
    """Train, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="cora")
    ap.add_argument("--root", required=True)
    ap.add_argument("--model", default="gin")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--plain", action="store_true", help="plain PyG, one process")
    a = ap.parse_args(argv)
    from fullgraph.datasets import load, to_pyg

    torch.manual_seed(0)
    data = to_pyg(load(a.dataset, a.root))
    weighted = a.model.startswith("gcn")
    if weighted and getattr(data, "edge_weight", None) is None:
        data.edge_weight = torch.ones(data.edge_index.shape[1])
    if a.plain:
        model = build(a.model, data.num_features, int(data.y.max()) + 1)
        rank = 0
    else:
        from fullgraph import pyg

        data = pyg.load_part(data)
        model = pyg.distribute(build(a.model, data.num_features, data.num_classes), data)
        rank = data.fullgraph.comm.rank
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    ew = data.edge_weight if weighted else None
    masks = (data.train_mask, data.val_mask, data.test_mask)
    best = (-1.0, 0.0)
    for _ in range(a.epochs):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index, ew)
        if a.plain:
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        else:
            loss = pyg.loss(out, data)
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index, ew).argmax(-1)
        if a.plain:
            accs = [float((pred[m] == data.y[m]).float().mean()) for m in masks]
        else:
            accs = [pyg.accuracy(pred, data, m) for m in masks]
        if accs[1] > best[0]:
            best = (accs[1], accs[2])
    if rank == 0:
        how = "plain PyG, 1 process" if a.plain else "fullgraph.pyg"
        print(
            f"{a.dataset} {a.model} ({how}): best val {best[0]:.4f}, test at best val {best[1]:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
