"""Worker of ``tests/propagation/test_hops.py``, run by :func:`harness.run_task`.

``hops --parts DIR --transports T... --propagations P... --hops K``: every rank loads its part
and computes ``[X, A X, ..., A^K X]`` of each propagation over each transport
(:func:`rank_hops`); rank 0 saves (``.npz``) every one in global node order, keyed
``transport/propagation``. The test calls :func:`rank_hops` in-process on the whole graph for
the reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import Tasks, communicators, main

#: ``ppr``'s teleport probability in these tests
ALPHA = 0.15


def rank_hops(part: Any, comm: Any, propagation: str, hops: int) -> np.ndarray:
    """This rank's hops of ``propagation`` gathered on every rank in global node order,
    float32 [N, (K + 1) F]."""
    from fullgraph.distributed.halo import HaloPlan
    from fullgraph.models.local_graph import as_tensor
    from fullgraph.propagation.hops import propagate_hops
    from fullgraph.propagation.operators import propagation_operator

    plan = HaloPlan.from_partition(part, comm)
    op = propagation_operator(part, "gcn" if propagation == "ppr" else propagation)
    x = as_tensor(part.x, np.float32)
    alpha = ALPHA if propagation == "ppr" else None
    kept = propagate_hops(x, op, plan, hops, propagation=propagation, alpha=alpha)
    rows = torch.cat(kept, dim=1).numpy()
    pieces = comm.allgather_object((np.asarray(part.global_ids[: part.num_inner]), rows))
    n = sum(ids.size for ids, _ in pieces)
    out = np.zeros((n, rows.shape[1]), dtype=np.float32)
    for ids, block in pieces:
        out[ids] = block
    return out


TASKS = Tasks()


@TASKS.task
def hops(
    *, parts: Path, transports: list[str], propagations: list[str], hops: int
) -> dict[str, np.ndarray]:
    """Every propagation's hops over every transport, in global node order."""
    from fullgraph.partition import load_partition

    out: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        part = load_partition(parts, comm.rank)
        for propagation in propagations:
            out[f"{transport}/{propagation}"] = rank_hops(part, comm, propagation, hops)
    return out


if __name__ == "__main__":
    sys.exit(main(TASKS))
