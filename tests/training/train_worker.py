"""Worker of the training tests (``tests/training``): tasks run by :func:`harness.run_task`.

``exact --parts DIR --transports T... [--precision P] [--variants a,b]``: trains every model
variant of :data:`VARIANTS` (or those named) at ``--precision`` for :data:`EPOCHS` epochs and
saves (rank 0, ``.npz``) the first step's training logits in global node order, the
all-reduced parameter gradients of that step and the loss of every epoch, and whether
:func:`check_halo_exchange` held. The tests call :func:`run_variants` in-process on the whole
graph for the reference.

``accuracy --parts DIR... --transports T... --seeds S... [--model gcn|gat]``: the Planetoid
recipe of ``model`` (:data:`RECIPES`) for each seed; saves (``.json``) the test accuracy at the
best validation epoch per seed, keyed ``transport/parts``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import Tasks, communicators, main

EPOCHS = 20
#: quantity -> (rtol, atol) of :func:`harness.assert_matches_one_process` for what
#: :func:`run_variants` returns: the step-1 logits and parameter gradients, every epoch's loss
STEP_TOLERANCES = {"logits": (1e-5, 1e-5), "grads": (1e-5, 1e-6), "losses": (1e-4, 0.0)}
#: (name, model, input dropout): dropout 0.5 between layers in all of them; input dropout 0
#: switches on the precomputed first aggregation.
VARIANTS = [
    ("gcn", "gcn", 0.5),
    ("sage", "sage", 0.5),
    ("gcn_pre", "gcn", 0.0),
    ("sage_pre", "sage", 0.0),
    ("sage_sliced", "sage", 0.5),
    ("gat", "gat", 0.5),
    ("gat_norm_res", "gat", 0.5),
    ("gcn_batchnorm", "gcn", 0.5),
    ("sage_layernorm_res", "sage", 0.5),
    ("sage_unpruned", "sage", 0.5),
    ("gin", "gin", 0.5),
    ("gin_pre", "gin", 0.0),
    ("sage_max", "sage", 0.5),
    ("graphconv", "graphconv", 0.5),
    ("graphconv_max_res", "graphconv", 0.0),
]
#: Variants that need a partition with edge weights (run only when named, by
#: ``tests/training/test_train_edge_weight.py``).
EDGE_VARIANTS = [
    ("gcn_edge_weight", "gcn", 0.5),
    ("gcn_edge_weight_improved_pre", "gcn", 0.0),
    ("gcn_improved", "gcn", 0.5),
]
EDGE_OPTIONS: dict[str, dict[str, Any]] = {
    "gcn_edge_weight": {"edge_weight": True},
    "gcn_edge_weight_improved_pre": {"edge_weight": True, "improved": True},
    "gcn_improved": {"improved": True, "norm": "batch"},
}
#: Further TrainConfig fields of some variants. The GAT layers of the 12-feature test graph
#: exchange their input (12 or hidden x heads columns < heads x (hidden + 1)) except the last,
#: which exchanges its projected rows and source terms: both exchanges are checked. Attention
#: dropout is on in both (0.3, and the default = --dropout 0.5).
OPTIONS: dict[str, dict[str, Any]] = {
    "gat": {"hidden": 6, "heads": 3, "output_heads": 2, "attention_dropout": 0.3},
    "gat_norm_res": {
        "hidden": 8,
        "heads": 2,
        "output_heads": 1,
        "norm": "batch",
        "residual": True,
    },
    "gcn_batchnorm": {"norm": "batch"},
    "sage_layernorm_res": {"norm": "layer", "residual": True},
    "sage_unpruned": {"prune": "off"},  # ``sage`` prunes its last layer: the same numbers
    "sage_max": {"aggr": "max"},  # the input's halo rows exchanged, ties to the lowest id
    "graphconv_max_res": {"aggr": "max", "residual": True},  # nothing precomputed at 0
    "graphconv": {"norm": "layer"},  # sums unnormalised: logits of 100s without a norm
}
#: The accuracy recipes (PyG ``examples/gcn.py`` and ``examples/gat.py``: Planetoid,
#: row-normalised features, 200 epochs; the GAT recipe decays every layer's weights).
RECIPES: dict[str, dict[str, Any]] = {
    "gcn": {
        "layers": 2,
        "hidden": 16,
        "dropout": 0.5,
        "lr": 0.01,
        "weight_decay": 5e-4,
        "weight_decay_scope": "first",
    },
    "gat": {
        "layers": 2,
        "hidden": 8,
        "heads": 8,
        "output_heads": 1,
        "dropout": 0.6,
        "attention_dropout": 0.6,
        "lr": 0.005,
        "weight_decay": 5e-4,
        "weight_decay_scope": "all",
    },
}
#: Variants whose exchanges go in this many slices (``fullgraph.distributed.exchange_slices``;
#: shares of uneven size, some empty), so that the pipelined sliced exchange is checked too.
SLICES = {"sage_sliced": 7}


def run_variants(
    part: Any, comm: Any, precision: str = "32", names: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Logits and gradients of step 1 and losses of :data:`EPOCHS` epochs, per variant (those
    of ``names`` only, when given), at ``precision``."""
    import fullgraph.distributed.exchange_slices as slicing
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    out: dict[str, np.ndarray] = {}
    default_count = slicing.slice_count
    for name, model, in_drop in VARIANTS if names is None else VARIANTS + EDGE_VARIANTS:
        if names is not None and name not in names:
            continue
        if name in SLICES:
            slicing.slice_count = lambda rows, width, budget, n=SLICES[name]: n
        else:
            slicing.slice_count = default_count
        fields = {
            "model": model,
            "layers": 2 if model == "gcn" else 3,
            "hidden": 16,
            "dropout": 0.5,
            "input_dropout": in_drop,
            "epochs": EPOCHS,
            "seed": 3,
            "weight_decay": 5e-4,
            "weight_decay_scope": "all",
            "precision": precision,
        }
        cfg = TrainConfig(**{**fields, **OPTIONS.get(name, {}), **EDGE_OPTIONS.get(name, {})})
        tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
        if name in SLICES and comm.size > 1:
            assert len(tr.ctx.plan.slices(16, None, 0)) == SLICES[name], "not sliced"
        if name == "sage" and comm.size > 1:  # the last layer trains on a restricted plan
            assert len(tr.ctx.plans()) == 2 and tr.ctx.train_graphs[-1].pruned
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
    from fullgraph.distributed.halo import HaloExchange, HaloPlan

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


def accuracy_run(part: Any, comm: Any, seeds: list[int], model: str = "gcn") -> list[float]:
    """Test accuracy at the best validation epoch of the Planetoid recipe of ``model``
    (:data:`RECIPES`), per seed."""
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    accs = []
    for seed in seeds:
        cfg = TrainConfig(
            model=model, epochs=200, seed=seed, normalize_features=True, **RECIPES[model]
        )
        accs.append(Trainer(part, comm, cfg, RunOptions(quiet=True)).fit()["test_acc"])
    return accs


TASKS = Tasks()


@TASKS.task
def exact(
    *, parts: Path, transports: list[str], precision: str = "32", variants: str = "all"
) -> dict[str, np.ndarray]:
    """:func:`run_variants` (at ``precision``, of the comma-separated ``variants``) and
    :func:`check_halo_exchange` over each transport."""
    from fullgraph.partition import load_partition

    names = None if variants == "all" else variants.split(",")
    result: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        part = load_partition(parts, comm.rank)
        got = run_variants(part, comm, precision, names)
        got["halo_exchange_ok"] = np.asarray(check_halo_exchange(part, comm))
        result.update({f"{transport}/{k}": v for k, v in got.items()})
    return result


@TASKS.task
def accuracy(
    *, parts: list[Path], transports: list[str], seeds: list[int], model: str = "gcn"
) -> dict[str, list[float]]:
    """:func:`accuracy_run` of each partition over each transport."""
    from fullgraph.partition import load_partition

    result: dict[str, list[float]] = {}
    for transport, comm in communicators(transports):
        for path in parts:
            part = load_partition(path, comm.rank)
            result[f"{transport}/{path}"] = accuracy_run(part, comm, seeds, model)
    return result


if __name__ == "__main__":
    sys.exit(main(TASKS))
