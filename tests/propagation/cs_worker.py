"""Worker of ``tests/propagation/test_correct_smooth_ranks.py``, run by :func:`harness.run_task`.

``smooth --parts DIR --transports T...``: on every transport, Correct & Smooth of fixed logits
(drawn per global id, the same whatever the partition) under each parameter set of
:data:`CASES`, its scores gathered in global node order (rank 0 saves them, ``.npz``), and the
control: autoscale with its ``sigma`` summed in rank order (no block layout). Then a GCN
trained 3 epochs with ``--correct-smooth``: its evaluation (smoothed and base metrics) and the
smoothed scores of its logits. The test calls :func:`smooth_all` in-process on the whole graph
for the reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from harness import Tasks, communicators, main

#: name -> (correction layers, alpha, smoothing layers, alpha, scale or None: autoscale)
CASES = {
    "autoscale": (10, 0.8, 10, 0.6, None),
    "fixed": (20, 1.0, 20, 0.8, 20.0),
}
#: the control: autoscale, its sum over nodes in rank order
CONTROL = "autoscale:rank-order"
LOGITS_SEED = 11


def global_logits(num_nodes: int, num_classes: int) -> np.ndarray:
    """Fixed logits of every node, float32 [N, C] (every rank draws the same)."""
    rng = np.random.default_rng(LOGITS_SEED)
    return (2.0 * rng.standard_normal((num_nodes, num_classes))).astype(np.float32)


def _gather(comm: Any, gids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Every rank's rows in global order (the same on every rank)."""
    pieces = comm.allgather_object((gids, rows))
    n = sum(len(g) for g, _ in pieces)
    out = np.empty((n, rows.shape[1]), dtype=rows.dtype)
    for g, r in pieces:
        out[g] = r
    return out


def smooth_all(part: Any, comm: Any) -> dict[str, np.ndarray]:
    """C&S of :func:`global_logits` under every case and the control, and a trained GCN's
    smoothed evaluation, keyed by case."""
    import torch

    from fullgraph.distributed.halo import HaloPlan
    from fullgraph.propagation.correct_smooth import (
        CorrectSmooth,
        CorrectSmoothParams,
        symmetric_operator,
    )
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    rows = int(part.num_inner)
    gids = np.asarray(part.global_ids[:rows], dtype=np.int64)
    size = torch.tensor([float(rows)], dtype=torch.float64)
    num_nodes = int(comm.allreduce_(size, "sum", tag="setup")[0])
    logits = torch.from_numpy(global_logits(num_nodes, int(part.num_classes))[gids])
    plan = HaloPlan.from_partition(part, comm)
    out: dict[str, np.ndarray] = {}
    for name, values in [*CASES.items(), (CONTROL, CASES["autoscale"])]:
        params = CorrectSmoothParams(*values)
        cs = CorrectSmooth.of_part(part, plan, params)
        if name == CONTROL:  # the same, without the tree
            cs = CorrectSmooth(
                symmetric_operator(part),
                plan,
                cs.y,
                cs.train,
                cs.num_train,
                None,
                params,
            )
        out[f"{name}/scores"] = _gather(comm, gids, cs(logits).numpy())
        out[f"{name}/blocks"] = np.asarray(cs.blocks is not None)
    cfg = TrainConfig(
        model="gcn",
        layers=2,
        hidden=16,
        epochs=3,
        seed=3,
        lr=0.05,
        correct_smooth=True,
        correction_scale="auto",
        smoothing_layers=15,
    )
    tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
    for epoch in range(1, 4):
        tr.train_step(epoch)
    metrics = tr.evaluate()
    out["trainer/metrics"] = np.asarray([metrics[k] for k in sorted(metrics)])
    out["trainer/names"] = np.asarray(sorted(metrics))
    tr.model.eval()
    with torch.no_grad():
        trained = tr.model(tr.data["x"], tr.ctx, training=False)
    out["trainer/scores"] = _gather(comm, gids, tr.smoother(trained).numpy())
    return out


TASKS = Tasks()


@TASKS.task
def smooth(*, parts: Path, transports: list[str]) -> dict[str, np.ndarray]:
    """:func:`smooth_all` over each transport."""
    from fullgraph.partition import load_partition

    result: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        got = smooth_all(load_partition(parts, comm.rank), comm)
        result.update({f"{transport}/{k}": v for k, v in got.items()})
    return result


if __name__ == "__main__":
    sys.exit(main(TASKS))
