"""``fullgraph train``: full-batch training, one process or ``mpirun -n P`` ranks.

With ``--parts DIR`` every rank loads its own part (the rank count must equal the part count);
with ``--dataset NAME --root DIR`` (or ``--synthetic PRESET``) one process trains on the whole
graph, the reference every distributed run matches. The options are generated from
:class:`~fullgraph.training.config.TrainData`, :class:`~fullgraph.training.config.TrainConfig`
and the shared :class:`~fullgraph.run.options.RuntimeOptions` /
:class:`~fullgraph.run.options.RunOptions`; :class:`TrainCommand` runs on the scaffold of
:class:`~fullgraph.run.command.Command`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from fullgraph.partition import PartitionDir
from fullgraph.run.command import Command, Job
from fullgraph.run.options import RunOptions, RuntimeOptions, add_options
from fullgraph.training.config import TrainConfig, TrainData

#: The last line of a run that keeps no model file (no --save-model, no --log-json).
MODEL_NOT_KEPT = "model: not kept (add --save-model PATH to keep the best-validation model)"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    from fullgraph.cli import summary

    p = subparsers.add_parser(
        "train",
        help=summary("train"),
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
    p.set_defaults(func=TrainCommand.main)


class TrainCommand(Command):
    """``fullgraph train`` on this rank.

    Attributes:
        data: what the run trains on (parts or a whole graph).
        config: the experiment.
        parts: the partition directory, its ``meta.json`` read once (``--parts``), or ``None``.
    """

    name = "train"
    writes_model = True

    def configure(self) -> None:
        """The shared options, then the data and the experiment."""
        super().configure()
        self.data = TrainData.from_args(self.args)
        self.config = TrainConfig.from_args(self.args)
        self.parts: PartitionDir | None = None

    def check(self) -> None:
        """The rank count against the part count (``meta.json``, read here for the whole run)
        and the metric against its dataset and classes; the outputs apart from the inputs."""
        from fullgraph.errors import ConfigError
        from fullgraph.metrics import resolve_metric

        self.precision = self.resolve_precision(self.config.precision)
        self.config = dataclasses.replace(self.config, precision=self.precision.name)
        size = self.launch.size
        if self.data.parts:
            self.parts = PartitionDir.open(self.data.parts)
            self.parts.check_ranks(size, f"run `{self.launch.relaunch(self.parts.num_parts)}`")
            meta = self.parts.meta
            resolve_metric(self.config.metric, meta["dataset"], int(meta["num_classes"]))
            if self.config.task == "link" and not meta.get("link"):
                raise ConfigError(
                    f"--task link: {self.parts.root} carries no supervision edges (partition a "
                    f"link dataset: `fullgraph data linksplit`, then `fullgraph partition`)"
                )
            if self.config.edge_weight and not meta.get("edge_weight", False):
                raise ConfigError(
                    f"--edge-weight: {self.parts.root} stores no edge weights (partition a "
                    f"graph that has them: raw/edge_weight.csv.gz in the OGB layout)"
                )
        elif size > 1:
            raise ConfigError(f"{size} ranks need --parts (the whole graph trains in one process)")
        self.io.check_apart_from(self.data.inputs(self.parts), model=True)

    def run(self, job: Job) -> dict[str, Any]:
        """Outputs checked, the memory plan, the part, the trainer, the epochs."""
        from fullgraph.memory.model import GraphShape
        from fullgraph.memory.plan import StartupPlan
        from fullgraph.run.epochs import final_line
        from fullgraph.training.trainer import Trainer
        from fullgraph.watchdog import phase  # start-up phases: bounded by --timeout, named

        comm, data, cfg = job.comm, self.data, self.config
        job.open_outputs()
        # the memory plan (rank 0): the sizes checked before anything is allocated by them
        plan = StartupPlan(cfg, self.runtime.memory_check, job.info.local_size if data.parts else 1)
        shape = None
        if self.parts is not None:  # the sizes are in meta.json: checked before any part loads
            shape = GraphShape.from_meta(self.parts.meta) if comm.rank == 0 else None
            job.agree(lambda: plan.check_sizes(shape) if shape is not None else None)
            if comm.rank == 0:
                with phase("memory probe"):
                    plan.measure_floor(shape.num_features, shape.num_classes)
        with phase("part loading"):
            link = cfg.task == "link"
            part = job.agree(lambda: data.load_part(self.parts, comm.rank, cfg.seed, link))
        if self.parts is None:  # one process: the sizes are known once the graph is loaded
            from fullgraph.metrics import resolve_metric
            from fullgraph.training.assembly import check_edge_weights

            if cfg.edge_weight:
                check_edge_weights(part, "--edge-weight", data)

            resolve_metric(cfg.metric, part.meta.get("dataset"), int(part.num_classes))
            shape = GraphShape.from_part(part, data.label)
            plan.check_sizes(shape)
            with phase("memory probe"):
                plan.measure_floor(shape.num_features, shape.num_classes)
        plan_lines = job.agree(lambda: plan.report(shape) if shape is not None else [])
        for line in plan_lines:  # a warning before the model is built (--memory-check warn)
            if line.startswith("warning:"):
                print(f"fullgraph train: {line}", file=sys.stderr, flush=True)
        from fullgraph.propagation.cache import HopCache

        hop_cache = HopCache.of_run(  # sgc's and sign's hops: kept with --parts
            self.parts.root if self.parts is not None else None,
            force=job.run.force,
            verify=not data.no_verify,
            quiet=job.run.quiet,
        )
        kwargs: dict[str, Any] = dict(
            checkpoints=job.checkpoints,
            device=job.device,
            precision=self.precision,
            hop_cache=hop_cache,
        )
        with phase("model set-up"):
            if cfg.task == "link":
                from fullgraph.training.link_trainer import LinkTrainer, part_links

                links, link = job.agree(lambda p=part: part_links(p, data.dataset, data.root))
                trainer = LinkTrainer(part, comm, cfg, links, link, run=job.run, **kwargs)
            else:
                trainer = Trainer(part, comm, cfg, job.run, **kwargs)
        trainer.data_label = data.label
        partition_hash = part.partition_hash
        split = part.meta.get("split")  # which of the dataset's fixed splits (None: its only one)
        del part  # the trainer holds what it trains on; the rest of the part's arrays go
        if job.run.resume:
            with phase("checkpoint loading"):
                job.agree(trainer.resume)
        resolved = {
            "config": trainer.resolved_config(),
            "data": data.label,
            "partition_hash": partition_hash,
            "metric": trainer.metric,
        }
        if split is not None:
            resolved["split"] = split
        log = job.start(resolved, trainer.start_epoch)
        quiet = job.run.quiet
        job.start_line(
            f"model {cfg.model} L={cfg.layers} H={cfg.hidden}, epochs "
            f"{trainer.start_epoch}..{cfg.epochs}, metric {trainer.metric}, precision "
            f"{cfg.precision}, halo compression fwd {cfg.compress_fwd} bwd {cfg.compress_bwd}"
            f"{' + error feedback' if cfg.error_feedback else ''}"
        )
        graphs = trainer.ctx.train_graphs
        if comm.rank == 0 and not quiet and graphs is not None:
            for i, graph in enumerate(graphs):
                print(f"receptive field: {graph.describe(i)}", flush=True)
        if trainer.train_rows is not None and not quiet:  # a per-row stack's steps
            line = trainer.train_rows_line()
            if comm.rank == 0:
                print(line, flush=True)
        for line in plan_lines:  # the prediction with the other start lines
            if not line.startswith("warning:") and not quiet:
                print(line, flush=True)
        final = trainer.fit(log)
        if comm.rank == 0:
            print(final_line(final, job.threads), flush=True)
            model = job.run.model_path()
            if model is not None and model.is_file() and not quiet:
                print(f"model (best validation, epoch {final['best_epoch']}): {model}", flush=True)
            elif model is None and not quiet:
                print(MODEL_NOT_KEPT, flush=True)
        return final
