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
from typing import Any

from fullgraph.training.config import TrainConfig, TrainData
from fullgraph.training.job import Job, RunOptions, RuntimeOptions, add_options, run_job


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train GCN / GraphSAGE full-batch (mpirun -n P for P ranks)",
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


def run_train(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph train``; returns the exit status."""
    built: dict[str, Any] = {}

    def prepare(info: Any) -> None:
        built["data"] = TrainData.from_args(args)
        runtime = RuntimeOptions.from_args(args)
        from fullgraph.distributed import resolve_transport

        device = runtime.resolved_device(resolve_transport(runtime.transport, info))
        built["config"] = TrainConfig.from_args(args, device=device)
        _check_ranks(built["data"], info.size)

    run_job(
        "train",
        lambda: RuntimeOptions.from_args(args),
        lambda: RunOptions.from_args(args),
        prepare,
        lambda job: _train(job, built["data"], built["config"]),
    )
    return 0


def _train(job: Job, data: TrainData, cfg: TrainConfig) -> dict[str, Any]:
    from fullgraph.training.epochs import final_line
    from fullgraph.training.trainer import Trainer

    comm = job.comm
    job.open_outputs()
    plan_lines: list[str] = []
    floor = 0
    if comm.rank == 0:  # the memory plan: the floor measured before the part is loaded
        from fullgraph.training.plan import startup_floor

        meta = None
        if data.parts:
            from fullgraph.partition.format import read_meta

            meta = read_meta(data.parts)[0]
        floor = startup_floor(cfg, meta)
    part = job.agree(lambda: _load_part(data, comm.rank, cfg.seed))
    if comm.rank == 0:
        from fullgraph.training.memory_model import GraphShape
        from fullgraph.training.plan import startup_report

        shape = GraphShape.from_meta(meta) if meta else GraphShape.from_part(part, data.label)
        ranks_per_node = job.info.local_size if data.parts else 1
        plan_lines = startup_report(shape, cfg, ranks_per_node, floor)
    trainer = Trainer(part, comm, cfg, job.run, checkpoints=job.checkpoints)
    partition_hash = part.partition_hash
    del part  # the trainer holds what it trains on; the rest of the part's arrays go
    if job.run.resume:
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
    for line in plan_lines:  # warnings always, the prediction with the other start lines
        if line.startswith("warning:"):
            print(f"fullgraph train: {line}", file=sys.stderr, flush=True)
        elif not job.run.quiet:
            print(line, flush=True)
    final = trainer.fit(log)
    if comm.rank == 0:
        print(final_line(final, job.threads), flush=True)
    return final
