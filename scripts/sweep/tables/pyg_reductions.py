"""Family ``pyg reductions``: a converted script that keeps its own loss, mean or accuracy.

Each case runs one small user script (:data:`SCRIPT`, written into the case dir) under
``mpirun -n 2``: a two-layer ``GCNConv`` model on the ``tiny`` dataset, converted with
``pyg.distribute``, trained five SGD steps with the script's OWN reduction over node rows (not
``pyg.loss`` / ``pyg.accuracy``). The exact ones must end ``exact`` (exit 0): the script
compares its losses, parameters and hand-written accuracy on its part with the unconverted
model trained by the same code on the whole graph in one process, and exits 1 with a line
naming the difference otherwise. The refused ones must end with the one-line refusal naming
the call (printed once; every rank exits 1), before the first optimiser step.
"""

from __future__ import annotations

from ..records import Row, table

#: The user script: ``python script.py WHAT`` (``WHAT``: a key of its ``LOSSES``).
SCRIPT = b"""import sys
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from fullgraph import pyg
from fullgraph.datasets import load, to_pyg


class GCN(torch.nn.Module):
    def __init__(self, f, c):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(f, 16), GCNConv(16, c)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


LOSSES = {
    "cross_entropy": lambda o, d: F.cross_entropy(o[d.train_mask], d.y[d.train_mask]),
    "criterion": lambda o, d: torch.nn.CrossEntropyLoss()(o[d.train_mask], d.y[d.train_mask]),
    "nll_loss": lambda o, d: F.nll_loss(F.log_softmax(o, dim=1)[d.train_mask], d.y[d.train_mask]),
    "mean": lambda o, d: -o.log_softmax(-1)[d.train_mask].gather(
        1, d.y[d.train_mask].view(-1, 1)).mean(),
    "torch_sum_over_count": lambda o, d: torch.sum(F.cross_entropy(
        o[d.train_mask], d.y[d.train_mask], reduction="none")) / d.train_mask.sum(),
    "index_tensor": lambda o, d: F.cross_entropy(
        o[d.train_mask.nonzero().view(-1)], d.y[d.train_mask.nonzero().view(-1)]),
    "std": lambda o, d: F.cross_entropy(o[d.train_mask], d.y[d.train_mask]) + o.std(),
    "topk": lambda o, d: o[:, 0].topk(5).values.sum(),
    "argmax_nodes": lambda o, d: o[:, 0].argmax().float(),
    "smoothing_and_weight": lambda o, d: F.cross_entropy(
        o[d.train_mask], d.y[d.train_mask], weight=torch.ones(d.num_classes),
        label_smoothing=0.1),
}


def accuracy(out, d, m):
    return int((out.argmax(dim=-1)[m] == d.y[m]).sum()) / int(m.sum())


def run(data, converted):
    torch.manual_seed(0)
    model = GCN(data.num_features, int(data.y.max()) + 1)
    if converted:
        model = pyg.distribute(model, data)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for _ in range(5):
        model.train()
        opt.zero_grad()
        loss = LOSSES[sys.argv[1]](model(data.x, data.edge_index), data)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        acc = accuracy(model(data.x, data.edge_index), data, data.val_mask)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return torch.tensor(losses), params, acc


whole = to_pyg(load("tiny", "data"))
data = pyg.load_part("p2")  # the partition of the workspace (fullgraph partition)
got = run(data, True)  # first: a refusal ends the script here
want = run(whole, False)  # the script on one process: the unconverted model, the whole graph
for what, a, b in zip(("losses", "parameters"), got[:2], want[:2]):
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())):
        sys.exit(f"not exact: {what} differ by {float((a - b).abs().max()):.3g}")
if abs(got[2] - want[2]) > 1e-9:
    sys.exit(f"not exact: accuracy {got[2]:.4f} against {want[2]:.4f}")
print(f"exact: loss {float(got[0][-1]):.4f}, accuracy {got[2]:.4f}")
"""

SETUP = (("write", "script.py", SCRIPT),)


def exact(what: str) -> Row:
    """The script with reduction ``what`` ends ``exact`` on 2 ranks."""
    return Row(
        f"pyg own reduction exact: {what}",
        f"mpirun -n 2 python script.py {what}",
        expect="ok",
        setup=SETUP,
        timeout=180,
    )


def refused(what: str, needle: str) -> Row:
    """The script with reduction ``what`` is refused in one line naming ``needle``."""
    return Row(
        f"pyg own reduction refused: {what}",
        f"mpirun -n 2 python script.py {what}",
        expect="error",
        code=1,
        needle=needle,
        setup=SETUP,
        timeout=180,
    )


PYG_REDUCTIONS = table(
    "pyg reductions",
    *(
        exact(w)
        for w in (
            "cross_entropy",
            "criterion",
            "nll_loss",
            "mean",
            "torch_sum_over_count",
            "index_tensor",
        )
    ),
    refused("std", "Tensor.std on the node rows"),
    refused("topk", "Tensor.topk on the node rows"),
    refused("argmax_nodes", "Tensor.argmax on the node rows"),
    refused("smoothing_and_weight", "with label_smoothing and class weights"),
)
