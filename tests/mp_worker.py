"""Worker the multi-rank tests start with ``mpirun -n P python tests/mp_worker.py ...``.

``exact PARTS TRANSPORTS OUT.npz``: trains every model variant of :data:`VARIANTS` for
:data:`EPOCHS` epochs and saves (rank 0) the first step's training logits in global node
order, the all-reduced parameter gradients of that step and the loss of every epoch.
The tests call :func:`run_variants` in-process on the whole graph for the reference.

``accuracy PARTS TRANSPORTS OUT.json SEEDS``: the Planetoid GCN recipe for each seed; saves
the test accuracy at the best validation epoch per seed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch

EPOCHS = 20
#: (name, model, input dropout): dropout 0.5 between layers in all of them; input dropout 0
#: switches on the precomputed first aggregation.
VARIANTS = [
    ("gcn", "gcn", 0.5),
    ("sage", "sage", 0.5),
    ("gcn_pre", "gcn", 0.0),
    ("sage_pre", "sage", 0.0),
    ("sage_sliced", "sage", 0.5),
]
#: Variants whose exchanges go in this many slices (``fullgraph.exchange_slices``; shares of
#: uneven size, some empty), so that the pipelined sliced exchange is checked too.
SLICES = {"sage_sliced": 7}


def run_variants(part: Any, comm: Any) -> dict[str, np.ndarray]:
    """Logits and gradients of step 1 and losses of :data:`EPOCHS` epochs, per variant."""
    import fullgraph.exchange_slices as slicing
    from fullgraph.trainer import TrainConfig, Trainer

    out: dict[str, np.ndarray] = {}
    default_count = slicing.slice_count
    for name, model, in_drop in VARIANTS:
        if name in SLICES:
            slicing.slice_count = lambda rows, width, budget, n=SLICES[name]: n
        else:
            slicing.slice_count = default_count
        cfg = TrainConfig(
            model=model,
            layers=2 if model == "gcn" else 3,
            hidden=16,
            dropout=0.5,
            input_dropout=in_drop,
            epochs=EPOCHS,
            seed=3,
            weight_decay=5e-4,
            weight_decay_scope="all",
            quiet=True,
        )
        tr = Trainer(part, comm, cfg)
        if name in SLICES and comm.size > 1:
            assert len(tr.ctx.plan.slices(16, None, 0)) == SLICES[name], "not sliced"
        step = tr.train_step(1)
        logits = tr.gather_logits(step.logits)
        grads = torch.cat([p.grad.reshape(-1) for p in tr.model.parameters()]).numpy().copy()
        losses = [step.loss] + [tr.train_step(e).loss for e in range(2, EPOCHS + 1)]
        if comm.rank == 0:
            out[f"{name}/logits"] = logits
            out[f"{name}/grads"] = grads
            out[f"{name}/losses"] = np.asarray(losses)
    slicing.slice_count = default_count
    return out


def check_halo_exchange(part: Any, comm: Any) -> bool:
    """HaloExchange alone: halo rows arrive from their owners; gradients return and are summed.

    Row ``i`` holds ``(gid, 2 gid + 1)``; the halo must hold those of its global ids, and the
    gradient of ``sum(halo)`` on an inner row is the number of peers it is sent to.
    """
    from fullgraph.halo import HaloExchange, HaloPlan

    plan = HaloPlan.from_partition(part, comm)
    gids = torch.from_numpy(np.array(part.global_ids, dtype=np.int64)).double()
    h = torch.stack([gids[: part.num_inner], 2 * gids[: part.num_inner] + 1], dim=1)
    h.requires_grad_(True)
    halo = HaloExchange.apply(h, plan)
    want = torch.stack([gids[part.num_inner :], 2 * gids[part.num_inner :] + 1], dim=1)
    halo.sum().backward()
    sent = torch.zeros(part.num_inner, dtype=torch.float64)
    sent.index_add_(0, plan.send_index, torch.ones(len(plan.send_index), dtype=torch.float64))
    ok = torch.equal(halo.detach(), want) and torch.equal(h.grad, sent[:, None].expand(-1, 2))
    return all(comm.allgather_object(bool(ok)))


def accuracy_run(part: Any, comm: Any, seeds: list[int]) -> list[float]:
    """Test accuracy at the best validation epoch of the Planetoid GCN recipe, per seed."""
    from fullgraph.trainer import TrainConfig, Trainer

    accs = []
    for seed in seeds:
        cfg = TrainConfig(
            model="gcn",
            layers=2,
            hidden=16,
            dropout=0.5,
            lr=0.01,
            weight_decay=5e-4,
            weight_decay_scope="first",
            epochs=200,
            seed=seed,
            normalize_features=True,
            quiet=True,
        )
        accs.append(Trainer(part, comm, cfg).fit()["test_acc"])
    return accs


def main(argv: list[str]) -> int:
    """Entry point under mpirun: ``MODE PARTS TRANSPORTS OUT [SEEDS]``.

    ``PARTS`` may list several partition directories separated by ``,`` (accuracy mode) and
    ``TRANSPORTS`` several transports (exact mode); results are keyed by both.
    """
    import numba

    from fullgraph.comm import create_communicator
    from fullgraph.launch import detect_launch
    from fullgraph.partition import load_partition

    mode, parts_list, transports, out_path = argv[:4]
    torch.set_num_threads(1)
    numba.set_num_threads(1)  # idle OpenMP workers spin; oversubscribed ranks must not
    info = detect_launch()
    result: dict[str, Any] = {}
    for transport in transports.split(","):
        comm = create_communicator(transport, info, timeout_s=60)
        for parts in parts_list.split(","):
            part = load_partition(parts, comm.rank)
            if mode == "exact":
                got = run_variants(part, comm)
                got["halo_exchange_ok"] = np.asarray(check_halo_exchange(part, comm))
                result.update({f"{transport}/{k}": v for k, v in got.items()})
            elif mode == "accuracy":
                seeds = [int(s) for s in argv[4].split(",")]
                result[f"{transport}/{parts}"] = accuracy_run(part, comm, seeds)
            else:
                raise SystemExit(f"unknown mode {mode}")
        comm.close()
    if info.rank == 0:
        if mode == "exact":
            np.savez(out_path, **result)
        else:
            with open(out_path, "w") as f:
                json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
