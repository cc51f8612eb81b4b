"""Worker of ``tests/pyg/test_node_rows.py``: a script's own reductions over node rows.

``scripts --source sbm`` (run by :func:`harness.run_task`): the GCN of ``examples/gcn_cora.py``
converted and trained :data:`pyg_worker.STEPS` SGD steps (dropout off) with each loss of
:data:`LOSSES`, written by hand as a single-process script writes it, and scored with each
hand-written accuracy of :data:`ACCURACIES`; rank 0 saves the losses, the parameters after the
last step and the accuracies. The tests compare them with the same script on one process
(:func:`run_scripts` on the unconverted model and the whole graph).

``zero_rows --source sbm``: the reductions of :data:`ZERO_ROWS` over the nodes of rank 0 only
(so every other rank has no row), each against plain torch on the gathered rows.

``refusals --source sbm``: each call of :data:`REFUSED` on the converted model's output, caught;
saves its message and whether every rank still holds the parameters it started from.
``refusals --source sbm --uncaught NAME`` lets that refusal end the script.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyg_worker
import torch
import torch.nn.functional as F
from harness import Tasks, main

from fullgraph import pyg


def _m(data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return data.train_mask, data.y


def _weighted(out: torch.Tensor, data: Any) -> torch.Tensor:
    m, y = _m(data)
    counts = torch.bincount(y[m], minlength=int(data.num_classes)).float()
    return F.cross_entropy(out[m], y[m], weight=1.0 / counts.clamp(min=1.0))


#: Name -> a loss as a single-process script writes it, ``(out, data) -> loss``.
LOSSES: dict[str, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    "cross_entropy": lambda out, d: F.cross_entropy(out[d.train_mask], d.y[d.train_mask]),
    "nll_log_softmax": lambda out, d: F.nll_loss(
        F.log_softmax(out, dim=-1)[d.train_mask], d.y[d.train_mask]
    ),
    "mean_of_rows": lambda out, d: (
        -(out.log_softmax(-1)[d.train_mask].gather(1, d.y[d.train_mask][:, None])).mean()
    ),
    "sum_over_count": lambda out, d: (
        F.cross_entropy(out[d.train_mask], d.y[d.train_mask], reduction="sum") / d.train_mask.sum()
    ),
    "torch_mean_none": lambda out, d: torch.mean(
        F.cross_entropy(out[d.train_mask], d.y[d.train_mask], reduction="none")
    ),
    "module_smoothing": lambda out, d: torch.nn.CrossEntropyLoss(label_smoothing=0.1)(
        out[d.train_mask], d.y[d.train_mask]
    ),
    "weighted_bincount": _weighted,
    "mse_one_hot": lambda out, d: F.mse_loss(
        out.softmax(-1)[d.train_mask], F.one_hot(d.y[d.train_mask]).float()
    ),
}


#: Name -> a hand-written accuracy ``(out, data) -> float`` on the validation nodes.
ACCURACIES: dict[str, Callable[[torch.Tensor, Any], float]] = {
    "tensor_division": lambda out, d: float(
        (out.argmax(dim=-1)[d.val_mask] == d.y[d.val_mask]).sum() / d.val_mask.sum()
    ),
    "int_division": lambda out, d: (
        int((out.argmax(1)[d.val_mask] == d.y[d.val_mask]).sum()) / int(d.val_mask.sum())
    ),
    "float_mean": lambda out, d: float(
        out.argmax(-1)[d.val_mask].eq(d.y[d.val_mask]).float().mean()
    ),
}


def run_scripts(data: Any) -> dict[str, np.ndarray]:
    """Every loss of :data:`LOSSES` on the GCN (converted when ``data`` is a part)."""
    results: dict[str, np.ndarray] = {}
    part = getattr(data, "fullgraph", None)
    for name, loss_fn in LOSSES.items():
        model = pyg_worker.build("gcn", data.num_features, data.num_classes, 0.0)
        if part is not None:
            model = pyg.distribute(model, data)
        scores: dict[str, float] = {}

        def accuracy(out: torch.Tensor, scores: dict[str, float] = scores) -> float:
            scores.update({k: fn(out, data) for k, fn in ACCURACIES.items()})
            return scores["tensor_division"]

        got = pyg_worker.train(model, data, lambda out, f=loss_fn: f(out, data), accuracy)
        results[f"{name}/losses"] = got["losses"]
        results[f"{name}/params"] = got["params"]
        results[f"{name}/grads"] = got["grads"]
        for k, v in scores.items():
            results[f"{name}/acc/{k}"] = np.asarray(v)
        if part is not None:
            same = part.comm.allgather_object(got["params"].tobytes())
            results[f"{name}/same_on_every_rank"] = np.asarray(len(set(same)) == 1)
    return results


#: Name -> a reduction ``(x, y, m) -> tensor`` of float rows ``x``, labels ``y``, node mask ``m``.
ZERO_ROWS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cross_entropy": lambda x, y, m: F.cross_entropy(x[m], y[m]),
    "sum": lambda x, y, m: x[m].sum(),
    "mean": lambda x, y, m: x[m].mean(),
    "mean_dim0": lambda x, y, m: x[m].mean(dim=0),
    "sum_dim0_keepdim": lambda x, y, m: torch.sum(x[m], 0, keepdim=True),
    "count": lambda x, y, m: m.sum(),
    "correct": lambda x, y, m: (x.argmax(-1)[m] == y[m]).sum(),
    "max_label": lambda x, y, m: y[m].max() if m.any() else torch.tensor(-1),
    "amax_dim0": lambda x, y, m: x[m].detach().amax(dim=0),
    "any": lambda x, y, m: (x[m] > 1).any(),
    "all": lambda x, y, m: (x[m] > -100).all(),
    "nanmean": lambda x, y, m: x[m].nanmean(),
}


TASKS = Tasks()


def _part(source: str) -> Any:
    from conftest import build_sbm_graph

    return pyg.load_part(build_sbm_graph() if source == "sbm" else source, threads=1)


@TASKS.task
def scripts(*, source: str) -> dict[str, np.ndarray]:
    """:func:`run_scripts` on the part of ``source`` (``sbm``, or a partition directory)."""
    return run_scripts(_part(source))


@TASKS.task
def zero_rows(*, source: str) -> dict[str, np.ndarray]:
    """Each of :data:`ZERO_ROWS` over rank 0's nodes, against plain torch on the gathered rows
    (on every rank): ``NAME/got``, ``NAME/want``, ``NAME/rows`` (this rank's counted rows)."""
    data = _part(source)
    pg = data.fullgraph
    model = pyg.distribute(pyg_worker.build("gcn", data.num_features, data.num_classes, 0.0), data)
    out = model(data.x, data.edge_index)
    mine = torch.full((pg.num_inner,), pg.comm.rank == 0)
    mask = data.train_mask & mine  # data.train_mask is node rows: so is the mask
    full = torch.from_numpy(pyg_worker.gather_rows(out, data)).float()
    ys = pg.comm.allgather_object((pg.global_ids, data.y.numpy(), mask.numpy()))
    y_full = torch.zeros(full.shape[0], dtype=torch.int64)
    m_full = torch.zeros(full.shape[0], dtype=torch.bool)
    for ids, y, m in ys:
        y_full[ids], m_full[ids] = torch.from_numpy(y), torch.from_numpy(m)
    results: dict[str, np.ndarray] = {}
    for name, fn in ZERO_ROWS.items():
        got = fn(out, data.y, mask)
        want = fn(full, y_full, m_full)
        every = pg.comm.allgather_object(got.detach().double().numpy())
        results[f"{name}/got"] = np.stack(every)
        results[f"{name}/want"] = want.detach().double().numpy()
    results["rows"] = np.asarray(pg.comm.allgather_object(int(plain_sum(mask))))
    return results


def plain_sum(mask: torch.Tensor) -> int:
    """This rank's count of ``mask`` (without the global sum)."""
    from fullgraph.pyg.node_rows import plain

    return int(plain(mask).sum())


#: Name -> a refused call on the output ``out`` and the part ``data``.
REFUSED: dict[str, Callable[[torch.Tensor, Any], Any]] = {
    "std": lambda out, d: out[d.train_mask].std(),
    "var_dim0": lambda out, d: torch.var(out, dim=0),
    "max_grad": lambda out, d: out.max(),
    "argmax_nodes": lambda out, d: out[:, 0].argmax(),
    "topk": lambda out, d: torch.topk(out[:, 0], 3),
    "sort_nodes": lambda out, d: out[:, 0].sort(),
    "softmax_nodes": lambda out, d: F.softmax(out, dim=0),
    "norm": lambda out, d: out.norm(),
    "median": lambda out, d: out.median(),
    "contract_nodes": lambda out, d: out.t() @ out,
    "item": lambda out, d: out[:1, :1].item(),
    "smoothing_weight": lambda out, d: F.cross_entropy(
        out, d.y, weight=torch.ones(int(d.num_classes)), label_smoothing=0.1
    ),
    "legacy_size_average": lambda out, d: F.nll_loss(out, d.y, size_average=True),
}


@TASKS.task
def refusals(*, source: str, uncaught: str = "") -> dict[str, np.ndarray]:
    """Each of :data:`REFUSED` before the first step, caught (``NAME``: the message); with
    ``uncaught``, that one ends the script. ``params_kept``: no parameter changed."""
    from fullgraph.errors import ConfigError

    data = _part(source)
    model = pyg.distribute(pyg_worker.build("gcn", data.num_features, data.num_classes, 0.0), data)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    results: dict[str, np.ndarray] = {}
    for name, fn in REFUSED.items():
        out = model(data.x, data.edge_index)
        if name == uncaught:
            fn(out, data).backward()
            opt.step()
        try:
            fn(out, data)
            results[name] = np.asarray("")
        except ConfigError as error:
            results[name] = np.asarray(str(error))
    kept = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    results["params_kept"] = np.asarray(kept)
    refused = sorted(k for k, v in results.items() if k in REFUSED and str(v))
    every = data.fullgraph.comm.allgather_object(refused)
    results["refused_on_every_rank"] = np.asarray(all(r == refused for r in every))
    return results


if __name__ == "__main__":
    sys.exit(main(TASKS))
