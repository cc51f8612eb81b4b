"""``fullgraph minibatch``: the neighbour-sampling GraphSAGE baseline, data-parallel over ranks.

``mpirun -n P fullgraph minibatch --dataset NAME --root DIR --fanouts 15,10,5 --batch-size B``
reads the whole graph on every rank (memory-mapped, so shared by the ranks of a machine), trains
with sampled blocks and prints the same start line, memory-plan line, per-epoch line (and
writes the same JSON fields) as ``fullgraph train``: both run on the scaffold of
:mod:`fullgraph.run.command` and the epochs of :mod:`fullgraph.run.epochs`. Within an epoch rank
0 prints a progress line every ``--progress-every`` seconds. ``--save-model`` (default
``<log stem>.model.pt`` beside ``--log-json``) writes ``fullgraph train``'s model file, by the
same output rules, so ``fullgraph predict`` and ``fullgraph export`` read it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from fullgraph.commands.train import MODEL_NOT_KEPT
from fullgraph.minibatch.config import MinibatchConfig, MinibatchData, ProgressOptions
from fullgraph.precision import Precision
from fullgraph.run.command import Command, Job
from fullgraph.run.options import RunOptions, RuntimeOptions, add_options

if TYPE_CHECKING:
    from fullgraph.datasets import Graph

#: Run options the baseline has no use for (it keeps no checkpoints); its --force is its own.
_NO_CHECKPOINTS = ("checkpoint", "checkpoint_every", "resume", "force")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``minibatch`` subcommand to the ``fullgraph`` parser."""
    p = subparsers.add_parser(
        "minibatch",
        help="train GraphSAGE with neighbour sampling (the mini-batch baseline)",
        description=(
            "Mini-batch GraphSAGE (mean) with uniform neighbour sampling without replacement, "
            "data-parallel over the ranks of an MPI job (graph read by every rank, memory-mapped "
            "and shared where the dataset has a processed cache; gradients all-reduced). "
            "Evaluation is exact layer-wise full-graph inference, each rank holding its rows of "
            "a layer. Example: "
            "mpirun -n 2 fullgraph minibatch --dataset cora --root data --fanouts 15,10,5"
        ),
    )
    add_options(
        p,
        ("data", MinibatchData, ()),
        ("model, sampling and optimiser", MinibatchConfig, ()),
        ("runtime", RuntimeOptions, ("device",)),
    )
    outputs = p.add_argument_group("run outputs")
    RunOptions.add_arguments(outputs, exclude=_NO_CHECKPOINTS)
    ProgressOptions.add_arguments(outputs)
    outputs.add_argument(
        "--force",
        action="store_true",
        help="replace the --log-json and --save-model of an earlier run (only files fullgraph "
        "wrote: a training log, a model file)",
    )
    p.set_defaults(func=MinibatchCommand.main)


class MinibatchCommand(Command):
    """``fullgraph minibatch`` on this rank (CPU only; no checkpoints).

    Attributes:
        data: the dataset every rank reads.
        config: model, sampling and optimiser.
    """

    name = "minibatch"
    writes_model = True

    def configure(self) -> None:
        """The shared options (the device is the CPU), then the data and the experiment."""
        self.runtime = RuntimeOptions.from_args(self.args, device="cpu")
        self.io = RunOptions.from_args(self.args)
        self.progress = ProgressOptions.from_args(self.args)
        self.data = MinibatchData.from_args(self.args)
        self.config = MinibatchConfig.from_args(self.args)

    def check(self) -> None:
        """Outputs apart from the dataset; no nccl (the baseline runs on the CPU)."""
        from fullgraph.datasets.paths import dataset_inputs
        from fullgraph.errors import ConfigError

        self.io.check_apart_from(dataset_inputs(self.data.dataset, self.data.root), model=True)
        self.precision = self.resolve_precision(self.config.precision)
        self.config = dataclasses.replace(self.config, precision=self.precision.name)
        if self.transport == "nccl":
            raise ConfigError(
                "the mini-batch baseline runs on the CPU: --transport nccl is not "
                "available, use mpi or gloo"
            )

    def run(self, job: Job) -> dict[str, Any]:
        """Outputs checked, the dataset loaded, the memory check, then the epochs."""
        return _train(
            job,
            self.data,
            self.config,
            self.runtime.memory_check,
            self.progress.progress_every,
            self.precision,
        )


def _memory_check(job: Job, graph: Graph, config: MinibatchConfig, check: str) -> list[str]:
    if job.comm.rank != 0:
        return []
    from fullgraph.memory.plan import check_minibatch

    return check_minibatch(graph, config, job.comm.size, job.info.local_size, check)


def _train(
    job: Job,
    data: MinibatchData,
    config: MinibatchConfig,
    memory_check: str,
    progress: float,
    precision: Precision,
) -> dict[str, Any]:
    """Outputs checked, dataset loaded (both agreed by all ranks), then the epochs."""
    from fullgraph.datasets import load, require_features
    from fullgraph.errors import DataError
    from fullgraph.metrics import resolve_metric
    from fullgraph.minibatch.trainer import MinibatchTrainer
    from fullgraph.run.epochs import final_line

    job.open_outputs()

    def load_graph() -> Graph:
        # the split of --split (default the first), as `fullgraph train`; memory-mapped where
        # the dataset has a processed cache, so that the ranks of a machine share its arrays
        graph = load(data.dataset, data.root, mmap=True, split=data.split)
        require_features(graph)
        if not graph.train_mask.any():
            raise DataError(f"{graph.name}: graph has no training nodes")
        resolve_metric(config.metric, graph.name, graph.num_classes)  # refused before any work
        return graph

    graph = job.agree(load_graph)
    # the memory check (rank 0), before the model is built: refused, or warned about
    plan_lines = job.agree(lambda: _memory_check(job, graph, config, memory_check))
    for line in plan_lines:
        if line.startswith("warning:"):
            print(f"fullgraph minibatch: {line}", file=sys.stderr, flush=True)
    quiet = job.run.quiet
    model_path = job.run.model_path()
    trainer = MinibatchTrainer(
        graph,
        job.comm,
        config,
        quiet=quiet,
        model_path=model_path,
        progress_every=progress,
        data_label=data.dataset,
        precision=precision,
    )
    resolved = {
        "config": {**config.to_dict(), "quiet": quiet},
        "data": data.dataset,
        "metric": trainer.metric,
    }
    if "split" in graph.meta:
        resolved["split"] = graph.meta["split"]
    log = job.start(resolved)
    batches = -(-int(trainer.train_nodes.size) // config.batch_size)
    job.start_line(
        f"model sage L={len(config.fanouts)} H={config.hidden}, fanouts "
        f"{','.join(map(str, config.fanouts))}, batch size {config.batch_size} ({batches} "
        f"step(s)/epoch), epochs 1..{config.epochs}, metric {trainer.metric}, precision "
        f"{config.precision}"
    )
    for line in plan_lines:  # the prediction with the other start lines
        if not line.startswith("warning:") and not quiet:
            print(line, flush=True)
    final = trainer.fit(log)
    if job.comm.rank == 0:
        print(final_line(final, job.threads), flush=True)
        if model_path is not None and model_path.is_file() and not quiet:
            print(f"model (best validation, epoch {final['best_epoch']}): {model_path}", flush=True)
        elif model_path is None and not quiet:
            print(MODEL_NOT_KEPT, flush=True)
    return final
