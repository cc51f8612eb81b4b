"""``fullgraph train``: full-batch training, one process or ``mpirun -n P`` ranks.

With ``--parts DIR`` every rank loads its own part (the rank count must equal the part count);
with ``--dataset NAME --root DIR`` (or ``--synthetic PRESET``) one process trains on the whole
graph, the reference every distributed run matches. The options are generated from
:class:`~fullgraph.training.config.TrainData`, :class:`~fullgraph.training.config.TrainConfig`
and the shared :class:`~fullgraph.training.job.RuntimeOptions` /
:class:`~fullgraph.training.job.RunOptions`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fullgraph.atomic import Place
from fullgraph.training.config import TrainConfig, TrainData
from fullgraph.training.job import Job, RunOptions, RuntimeOptions, add_options, run_job


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train GCN / GraphSAGE / GAT full-batch (mpirun -n P for P ranks)",
        description=(
            "Full-batch GNN training with the exact full-graph gradient. Distributed: "
            "`mpirun -n P fullgraph train --parts DIR ...` (P = parts). One process: "
            "`fullgraph train --dataset cora --root DATA ...`."
        ),
    )
    add_options(
        p,
        ("data (one of)", TrainData, ()),
        ("model and optimiser", TrainConfig, ()),
        ("runtime", RuntimeOptions, ()),
        ("run outputs", RunOptions, ()),
    )
    p.set_defaults(func=run_train)


def _load_part(data: TrainData, rank: int, seed: int) -> Any:
    """This rank's part, or the whole graph as the one part of a one-process run."""
    if data.parts:
        from fullgraph.partition.load import load_partition

        return load_partition(data.parts, rank, mmap=False, verify_checksums=not data.no_verify)
    from fullgraph.partition.whole import whole_graph_part

    if data.synthetic:
        from fullgraph.datasets.synthetic import generate

        return whole_graph_part(generate(data.synthetic, seed=seed))
    from fullgraph.datasets import load

    return whole_graph_part(load(data.dataset, data.root))


def _check_ranks(data: TrainData, size: int) -> None:
    """The rank count equals the part count (before any collective)."""
    from fullgraph.errors import ConfigError

    if data.parts:
        from fullgraph.partition.format import read_meta

        meta, _ = read_meta(data.parts)
        if int(meta["num_parts"]) != size:
            raise ConfigError(
                f"{data.parts} has {meta['num_parts']} parts but {size} ranks were "
                f"started; run `mpirun -n {meta['num_parts']}`"
            )
    elif size > 1:
        raise ConfigError(f"{size} ranks need --parts (the whole graph trains in one process)")


def _inputs(data: TrainData) -> list[Place]:
    """What the run reads, for the outputs' overlap check: its partition or dataset."""
    if data.parts:
        parts = Path(data.parts)
        parts = parts.parent if parts.name == "meta.json" and parts.is_file() else parts
        return [Place(parts, f"--parts {data.parts}", "the partition")]
    if data.dataset:
        from fullgraph.datasets.paths import dataset_inputs

        return dataset_inputs(data.dataset, data.root)
    return []


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph train``; returns the exit status."""
    built: dict[str, Any] = {}

    def prepare(info: Any) -> None:
        built["data"] = TrainData.from_args(args)
        runtime = RuntimeOptions.from_args(args)
        from fullgraph.distributed import resolve_transport

        device = runtime.resolved_device(resolve_transport(runtime.transport, info))
        built["config"] = TrainConfig.from_args(args, device=device)
        built["memory_check"] = runtime.memory_check
        _check_ranks(built["data"], info.size)
        RunOptions.from_args(args).check_apart_from(_inputs(built["data"]))

    run_job(
        "train",
        lambda: RuntimeOptions.from_args(args),
        lambda: RunOptions.from_args(args),
        prepare,
        lambda job: _train(job, built["data"], built["config"], built["memory_check"]),
    )
    return 0


def _train(job: Job, data: TrainData, cfg: TrainConfig, memory_check: str) -> dict[str, Any]:
    from fullgraph.training.epochs import final_line
    from fullgraph.training.memory_model import GraphShape
    from fullgraph.training.plan import StartupPlan
    from fullgraph.training.trainer import Trainer
    from fullgraph.watchdog import phase  # start-up phases: bounded by --timeout, named

    comm = job.comm
    job.open_outputs()
    # the memory plan (rank 0): the sizes checked before anything is allocated by them
    plan = StartupPlan(cfg, memory_check, job.info.local_size if data.parts else 1)
    shape = None
    if comm.rank == 0 and data.parts:
        from fullgraph.partition.format import read_meta

        shape = GraphShape.from_meta(read_meta(data.parts)[0])
    if data.parts:  # the sizes are in meta.json: checked before any part is loaded
        job.agree(lambda: plan.check_sizes(shape) if shape is not None else None)
        if comm.rank == 0:
            with phase("memory probe"):
                plan.measure_floor(shape.num_features, shape.num_classes)
    with phase("part loading"):
        part = job.agree(lambda: _load_part(data, comm.rank, cfg.seed))
    if not data.parts:  # one process: the sizes are known once the graph is loaded
        shape = GraphShape.from_part(part, data.label)
        plan.check_sizes(shape)
        with phase("memory probe"):
            plan.measure_floor(shape.num_features, shape.num_classes)
    plan_lines = job.agree(lambda: plan.report(shape) if shape is not None else [])
    for line in plan_lines:  # a warning before the model is built (--memory-check warn)
        if line.startswith("warning:"):
            print(f"fullgraph train: {line}", file=sys.stderr, flush=True)
    with phase("model set-up"):
        trainer = Trainer(part, comm, cfg, job.run, checkpoints=job.checkpoints)
    partition_hash = part.partition_hash
    del part  # the trainer holds what it trains on; the rest of the part's arrays go
    if job.run.resume:
        with phase("checkpoint loading"):
            job.agree(trainer.resume)
    resolved = {
        "config": trainer.resolved_config(),
        "data": data.label,
        "partition_hash": partition_hash,
    }
    log = job.start(resolved, trainer.start_epoch)
    if comm.rank == 0 and not job.run.quiet:
        print(
            f"fullgraph train: {comm.size} rank(s), transport {comm.transport}, "
            f"{job.threads} thread(s)/rank, model {cfg.model} L={cfg.layers} H={cfg.hidden}, "
            f"epochs {trainer.start_epoch}..{cfg.epochs}, halo compression "
            f"fwd {cfg.compress_fwd} bwd {cfg.compress_bwd}"
            f"{' + error feedback' if cfg.error_feedback else ''}",
            flush=True,
        )
    graphs = trainer.ctx.train_graphs
    if comm.rank == 0 and not job.run.quiet and graphs is not None:
        for i, graph in enumerate(graphs):
            print(f"receptive field: {graph.describe(i)}", flush=True)
    for line in plan_lines:  # the prediction with the other start lines
        if not line.startswith("warning:") and not job.run.quiet:
            print(line, flush=True)
    final = trainer.fit(log)
    if comm.rank == 0:
        print(final_line(final, job.threads), flush=True)
    return final
