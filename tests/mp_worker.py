"""Worker the multi-rank tests start with ``mpirun -n P python tests/mp_worker.py ...``.

``exact PARTS TRANSPORTS OUT.npz``: trains every model variant of :data:`VARIANTS` for
:data:`EPOCHS` epochs and saves (rank 0) the first step's training logits in global node
order, the all-reduced parameter gradients of that step and the loss of every epoch.
The tests call :func:`run_variants` in-process on the whole graph for the reference.

``accuracy PARTS TRANSPORTS OUT.json SEEDS [MODEL]``: the Planetoid recipe of ``MODEL`` (``gcn``,
default, or ``gat``: :data:`RECIPES`) for each seed; saves the test accuracy at the best
validation epoch per seed.

``reduce PARTS TRANSPORTS OUT.npz``: ``allreduce_`` sums of the :func:`reduce_input` vectors of
:data:`REDUCE_LENGTHS` lengths, and the parameters and losses after :data:`EPOCHS` epochs of the
default GCN (dropout on); saves (rank 0) the results and the failures of the checks every rank
made (same bits on every rank, bytes booked).
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
    ("gat", "gat", 0.5),
    ("gat_norm_res", "gat", 0.5),
    ("gcn_batchnorm", "gcn", 0.5),
    ("sage_layernorm_res", "sage", 0.5),
    ("sage_unpruned", "sage", 0.5),
]
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


#: Vector lengths of the ``reduce`` mode (P is added: P - 1 and P + 1 give uneven chunks,
#: 1 leaves every rank but rank 0 an empty chunk).
REDUCE_LENGTHS = (1, 1000003)


def reduce_input(rank: int, n: int, dtype: Any = np.float32) -> np.ndarray:
    """Rank ``rank``'s contribution of length ``n``: magnitudes spread over 2^-30..2^30.

    The spread makes sums in different orders round differently, so that a result equal to
    the left-to-right sum bit for bit shows the order.
    """
    rng = np.random.default_rng([n, rank])
    scale = np.exp2(rng.integers(-30, 31, n).astype(np.float64))
    return (rng.standard_normal(n) * scale).astype(dtype)


def reduce_run(part: Any, comm: Any) -> tuple[dict[str, np.ndarray], list[str]]:
    """Sums of :func:`reduce_input` vectors and 20 epochs of training; with the failures.

    Returns:
        Results (rank 0's ``sum/N``, ``params``, ``losses``) and this rank's failed checks.
    """
    import hashlib

    from fullgraph.distributed.communicator import chunk_sizes
    from fullgraph.models.gnn import parameter_vector
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    out: dict[str, np.ndarray] = {}
    fails: list[str] = []
    lengths = sorted({*REDUCE_LENGTHS, comm.size - 1, comm.size + 1})
    for n in lengths:
        for dtype in (np.float32, np.float64):
            t = torch.from_numpy(reduce_input(comm.rank, n, dtype))
            before = comm.bytes_sent["test"]
            comm.allreduce_(t, "sum", tag="test")
            mine = chunk_sizes(n, comm.size)[comm.rank]
            want = (n - mine + (comm.size - 1) * mine) * t.element_size()
            if comm.bytes_sent["test"] - before != want:
                fails.append(f"n={n}: booked {comm.bytes_sent['test'] - before} B, not {want}")
            digests = comm.allgather_object(hashlib.sha256(t.numpy().tobytes()).hexdigest())
            if len(set(digests)) != 1:
                fails.append(f"n={n} {np.dtype(dtype).name}: ranks hold different sums")
            if dtype is np.float32:
                out[f"sum/{n}"] = t.numpy().copy()
    cfg = TrainConfig(model="gcn", epochs=EPOCHS, dropout=0.5, seed=3)
    tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
    tr.fit()
    params = parameter_vector(tr.model).detach()
    if len(set(comm.allgather_object(params.numpy().tobytes()))) != 1:
        fails.append("ranks hold different parameters after training")
    out["params"] = params.numpy().copy()
    out["losses"] = np.asarray(tr.history["losses"])
    comm.barrier()
    return out, fails


def run_variants(part: Any, comm: Any) -> dict[str, np.ndarray]:
    """Logits and gradients of step 1 and losses of :data:`EPOCHS` epochs, per variant."""
    import fullgraph.distributed.exchange_slices as slicing
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    out: dict[str, np.ndarray] = {}
    default_count = slicing.slice_count
    for name, model, in_drop in VARIANTS:
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
        }
        cfg = TrainConfig(**{**fields, **OPTIONS.get(name, {})})
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


def main(argv: list[str]) -> int:
    """Entry point under mpirun: ``MODE PARTS TRANSPORTS OUT [SEEDS [MODEL]]``.

    ``PARTS`` may list several partition directories separated by ``,`` (accuracy mode) and
    ``TRANSPORTS`` several transports (exact and reduce modes); results are keyed by both.
    """
    import numba

    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.launch import detect_launch
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
            elif mode == "reduce":
                got, fails = reduce_run(part, comm)
                failures = result.setdefault("failures", [])
                for rank, theirs in enumerate(comm.allgather_object(fails)):
                    failures += [f"{transport} rank {rank}: {f}" for f in theirs]
                result.update({f"{transport}/{k}": v for k, v in got.items()})
            elif mode == "accuracy":
                seeds = [int(s) for s in argv[4].split(",")]
                model = argv[5] if len(argv) > 5 else "gcn"
                result[f"{transport}/{parts}"] = accuracy_run(part, comm, seeds, model)
            else:
                raise SystemExit(f"unknown mode {mode}")
        comm.close()
    if info.rank == 0:
        if mode == "reduce":
            result["failures"] = np.asarray(result.get("failures", []), dtype=str)
        if mode in ("exact", "reduce"):
            np.savez(out_path, **result)
        else:
            with open(out_path, "w") as f:
                json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
