"""Family ``pyg scripts``: the idioms a PyG user brings, and a rank that stalls in their code.

Each case runs one small user script (:data:`SCRIPT`, written into the case dir) under
``mpirun -n 2`` on the ``tiny`` dataset:

- ``adj_t`` (``T.ToSparseTensor()``): PyG's ``GCN(improved=True)`` called with ``data.adj_t``,
  unweighted and with edge weights (moved into ``adj_t``), must end ``exact`` against the
  unconverted model on the whole graph's ``adj_t``; ``GraphSAGE`` on a weighted ``adj_t`` is
  refused in one line;
- a stall of rank 1 in the script's own code (``time.sleep``) before the first collective, after
  epoch 3, at the loss: the job must end with the timeout line (exit 4), nothing left running;
  a ``ValueError`` on rank 1 ends the job with its traceback;
- ``load_part`` of wrong things (a number, a missing path, a file, a ``Data`` without ``y``, a
  PyG dataset): one line naming what it got, every rank exits 1;
- ``fullgraph partition --pyg`` of something that is not a saved graph: one line, exit 2.
"""

from __future__ import annotations

from ..records import Row, table

#: The user script: ``python script.py WHAT``.
SCRIPT = b"""import sys
import time
import torch
import torch_geometric.transforms as T
from torch_geometric.nn.models import GCN, GraphSAGE
from fullgraph import pyg
from fullgraph.datasets import load, to_pyg

what = sys.argv[1]
whole = to_pyg(load("tiny", "data"))
if what.startswith("load_part "):
    kind = what.split()[1]
    (open("file.pt", "w").write("x") if kind == "file" else None)
    no_y = whole.clone()
    del no_y.y
    from torch_geometric.data import InMemoryDataset

    class One(InMemoryDataset):
        def __init__(self):
            super().__init__(None)
            self.data, self.slices = self.collate([whole])

    wrong = {"int": 42, "missing": "parts/not-there-2", "file": "file.pt", "no_y": no_y,
             "dataset": One() if kind == "dataset" else None}[kind]
    pyg.load_part(wrong, timeout=30)
    sys.exit("load_part accepted it")
if "weighted" in what:
    g = torch.Generator().manual_seed(0)
    whole.edge_weight = torch.rand(whole.edge_index.shape[1], generator=g) + 0.5
if what.startswith("adj_t"):
    whole = T.ToSparseTensor()(whole)
make = {"sage": lambda f, c: GraphSAGE(f, 16, 2, c)}.get(
    what.split()[-1], lambda f, c: GCN(f, 16, 2, c, improved=True))
data = pyg.load_part(whole.clone(), timeout=10)
stalls = data.fullgraph.comm.rank == 1


def run(data, converted):
    torch.manual_seed(0)
    model = make(data.num_features, int(data.y.max()) + 1)
    if converted:
        model = pyg.distribute(model, data)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    m = data.train_mask
    for epoch in range(1, 6):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.adj_t if what.startswith("adj_t") else data.edge_index)
        if converted and stalls and what == "stall loss" and epoch == 3:
            time.sleep(3600)
        if converted:
            loss = pyg.loss(out, data)
        else:
            loss = torch.nn.functional.cross_entropy(out[m], data.y[m])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if converted and stalls and what == "stall epoch" and epoch == 3:
            time.sleep(3600)
        if converted and stalls and what == "raise" and epoch == 3:
            raise ValueError("a bug in the script on rank 1")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return torch.tensor(losses), params


if stalls and what == "stall before":
    time.sleep(3600)
got = run(data, True)
want = run(whole, False)
for name, a, b in zip(("losses", "parameters"), got, want):
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())):
        sys.exit(f"not exact: {name} differ by {float((a - b).abs().max()):.3g}")
print(f"exact: loss {float(got[0][-1]):.4f}")
"""

SETUP = (("write", "script.py", SCRIPT),)


def script(name: str, what: str, **kwargs: object) -> Row:
    """``mpirun -n 2 python script.py WHAT``."""
    return Row(name, f'mpirun -n 2 python script.py "{what}"', setup=SETUP, **kwargs)


def stall(where: str) -> Row:
    """Rank 1 stalls at ``where``: the other rank's collective times out (10 s), the job ends."""
    return script(
        f"pyg script: rank 1 stalls ({where})",
        f"stall {where}",
        expect="error",
        code=4,
        needle="did not complete within 10 s",
        timeout=150,
    )


def wrong(kind: str, needle: str) -> Row:
    """``load_part`` of a wrong thing: one line with ``needle``, exit 1."""
    return script(
        f"pyg load_part of a wrong thing: {kind}",
        f"load_part {kind}",
        expect="error",
        code=1,
        needle=needle,
        timeout=120,
    )


PYG_SCRIPTS = table(
    "pyg scripts",
    script("pyg script on adj_t: exact", "adj_t", expect="ok", timeout=180),
    script("pyg script on a weighted adj_t: exact", "adj_t weighted", expect="ok", timeout=180),
    script(
        "pyg script on a weighted adj_t: GraphSAGE refused",
        "adj_t weighted sage",
        expect="error",
        code=1,
        needle="data.adj_t carries the graph's edge weights",
        timeout=180,
    ),
    stall("before"),
    stall("epoch"),
    stall("loss"),
    script(
        "pyg script: rank 1 raises",
        "raise",
        expect="fails",
        needle="a bug in the script on rank 1",
        timeout=150,
    ),
    wrong("int", "load_part: got int 42; give a partition directory"),
    wrong("missing", "load_part: 'parts/not-there-2' does not exist"),
    wrong("file", "file.pt is a file, not a partition directory"),
    wrong("no_y", "has no labels (y)"),
    wrong("dataset", "load_part(dataset[0])"),
    Row(
        "partition --pyg of a file torch did not write",
        "fullgraph partition --pyg junk.pt --parts 2 --out own-p2",
        setup=(("write", "junk.pt", b"not a torch file\n"),),
        needle="junk.pt: not a file torch.save wrote",
        timeout=60,
    ),
    Row(
        "partition --pyg of a missing file",
        "fullgraph partition --pyg nothing.pt --parts 2 --out own-p2",
        needle="nothing.pt does not exist",
        timeout=60,
    ),
)
