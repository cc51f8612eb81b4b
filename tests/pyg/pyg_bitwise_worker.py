"""Worker of ``tests/pyg/test_pyg_bitwise.py``: PyG's model classes trained by a user's script.

``bitwise --source DIR --transports mpi gloo`` (run by :func:`harness.run_task`, result
``.npz``): over each transport, every model of :data:`MODELS` (PyG's ``GCN``, ``GraphSAGE``
with ``LayerNorm(mode="node")`` and ``GIN(train_eps=True)``, 2 layers, dropout 0.5) is
converted with ``pyg.distribute`` and trained :data:`STEPS` steps by :func:`train`, a script
as a PyG user writes it (their own ``Adam`` and ``F.cross_entropy(out[mask], y[mask])``);
rank 0 saves, per transport and model, the first
step's gradients, the losses, the final parameters and Adam's state. ``--control 1`` trains
once more over the first transport with the block tree off (``runtime.part_blocks`` gives no
blocks: every gradient all-reduced in rank order, as a partition without blocks trains), as
``control/...``.

The test calls :func:`run_models` in-process on the whole graph for the one-process reference.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from harness import Tasks, main
from torch import nn

from fullgraph import pyg
from fullgraph.pyg import runtime

#: Training steps of every model.
STEPS = 4
#: Node dropout of the models (PyG's ``BasicGNN`` ``dropout``).
DROPOUT = 0.5


def _basic_gnn(cls: str, **kwargs: Any) -> Callable[[int, int], nn.Module]:
    def make(in_channels: int, classes: int) -> nn.Module:
        import torch_geometric.nn.models as models

        return getattr(models, cls)(in_channels, 16, 2, classes, dropout=DROPOUT, **kwargs)

    return make


#: Model name -> builder ``(in_channels, classes)``.
MODELS: dict[str, Callable[[int, int], nn.Module]] = {
    "GCN": _basic_gnn("GCN"),
    "GraphSAGE-ln": _basic_gnn("GraphSAGE", norm="layer_norm", norm_kwargs={"mode": "node"}),
    "GIN-train-eps": _basic_gnn("GIN", train_eps=True),  # eps: the twin's own tree function
}


def train(model: nn.Module, data: Any) -> dict[str, np.ndarray]:
    """A user's training loop: Adam, cross-entropy over the training mask, :data:`STEPS`
    steps. Returns the first step's gradients, the losses, the final parameters and Adam's
    moments (float32 arrays)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    losses, out = [], {}
    for step in range(STEPS):
        model.train()
        opt.zero_grad()
        logits = model(data.x, data.edge_index)
        m = data.train_mask
        loss = F.cross_entropy(logits[m], data.y[m])
        loss.backward()
        if step == 0:
            out["grads"] = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
        opt.step()
        losses.append(loss.detach().reshape(1))
    out["losses"] = torch.cat(losses).numpy()
    out["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    state = [opt.state[p][k].reshape(-1) for p in model.parameters() for k in ("exp_avg",)]
    state += [opt.state[p]["exp_avg_sq"].reshape(-1) for p in model.parameters()]
    out["adam"] = torch.cat(state).numpy()
    return {k: np.array(v, copy=True) for k, v in out.items()}


def run_models(data: Any) -> dict[str, np.ndarray]:
    """Every model of :data:`MODELS` built from seed 0, converted for ``data`` (a part from
    ``load_part``) and trained by :func:`train`: ``name/field``."""
    results: dict[str, np.ndarray] = {}
    for name, make in MODELS.items():
        torch.manual_seed(0)
        model = pyg.distribute(make(data.num_features, data.num_classes), data)
        results.update({f"{name}/{k}": v for k, v in train(model, data).items()})
    return results


TASKS = Tasks()


@TASKS.task
def bitwise(*, source: str, transports: list[str], control: int = 0) -> dict[str, np.ndarray]:
    """:func:`run_models` on the part of partition directory ``source`` over each transport
    (``transport/name/field``); ``control``: once more over the first, the tree off."""
    from harness import communicators

    results: dict[str, np.ndarray] = {}
    for i, (transport, comm) in enumerate(communicators(transports)):
        data = pyg.load_part(source, comm)
        results.update({f"{transport}/{k}": v for k, v in run_models(data).items()})
        if control and i == 0:
            blocks = runtime.part_blocks
            runtime.part_blocks = lambda part: None  # rank order: no blocks
            try:
                got = run_models(pyg.load_part(source, comm))
            finally:
                runtime.part_blocks = blocks
            results.update({f"control/{k}": v for k, v in got.items()})
    return results


if __name__ == "__main__":
    sys.exit(main(TASKS))
