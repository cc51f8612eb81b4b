"""``fullgraph plan``: the predicted peak memory of every rank, before anything runs.

Reads a partition's ``meta.json`` and verifies every part file against its checksum
(read-only; a failing directory is refused with one line, exit 2), then prints, for every rank,
the peak the memory model predicts (:mod:`fullgraph.memory.model`) split into its terms, and for
every node (``--ranks-per-node`` consecutive ranks, as ``mpirun`` places them) whether its ranks
fit its memory (``--node-memory``, default this machine's). A node that does not fit ends the
command with one line and exit status 2. The model options are ``fullgraph train``'s own
(:class:`~fullgraph.training.config.TrainConfig`). With ``--predict`` the peak is
``fullgraph predict``'s with that model (no gradients, no optimiser state, the output rows
written a window at a time), beside the training peak. With ``--dataset NAME --root DIR`` (or
``--synthetic PRESET``) instead of ``--parts`` the run planned is ``fullgraph train``'s one
process on the whole graph, read as that run reads it. ``fullgraph plan minibatch`` plans a
``fullgraph minibatch`` run (:mod:`fullgraph.commands.plan_minibatch`). Nothing is written (but
a dataset's ``processed/`` cache, which the loader writes on its first read, as the run does).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fullgraph.commands.plan_table import SHORT, PlanOptions, print_fits, size_table
from fullgraph.config import option
from fullgraph.errors import ConfigError
from fullgraph.memory.model import (
    GraphShape,
    Prediction,
    check_modelled,
    current_rss_bytes,
    measure_floor,
    predict_quickly,
)
from fullgraph.memory.plan import GIB, MIB, machine_memory_bytes, mib, node_fits
from fullgraph.resources import file_backed_rss_bytes
from fullgraph.training.config import TrainConfig, TrainData

if TYPE_CHECKING:
    from fullgraph.partition import Partition

__all__ = ["PlanOptions", "print_fits", "size_table", "SHORT"]


@dataclass
class PlanData(TrainData):
    """What the planned run reads: a partition, or a whole graph trained in one process."""

    parts: str | None = option(
        None,
        "partition directory written by `fullgraph partition` (or its meta.json)",
        metavar="DIR",
    )
    dataset: str | None = option(
        None, "plan `fullgraph train --dataset NAME`: the whole graph in one process"
    )
    synthetic: str | None = option(
        None, "plan `fullgraph train --synthetic PRESET` (one process)", metavar="PRESET"
    )

    def check(self) -> None:
        """One source, as ``fullgraph train`` (``--parts DIR``, ``--dataset`` with ``--root``,
        or ``--synthetic``)."""
        if self.parts is None and self.dataset is None and self.synthetic is None:
            raise ConfigError(
                "--parts DIR is required (a directory written by `fullgraph partition`), or "
                "--dataset NAME --root DIR (or --synthetic PRESET) to plan one process on the "
                "whole graph; `fullgraph plan minibatch` plans the mini-batch baseline"
            )
        super().check()


def verified_shape(parts: str) -> GraphShape:
    """The partition's shape after every file of every part passed its size and checksum.

    Read-only: :func:`fullgraph.partition.format.read_meta` and
    :func:`~fullgraph.partition.format.check_file` (the loader's own checks).

    Raises:
        PartitionError: the directory, ``meta.json`` or a part file is missing or corrupted.
    """
    from fullgraph.errors import PartitionError
    from fullgraph.partition.format import (
        PART_ARRAYS,
        check_file,
        file_key,
        partition_root,
        read_meta,
    )

    root = partition_root(parts)
    meta, _ = read_meta(root)
    for rank in range(int(meta["num_parts"])):
        for name in PART_ARRAYS:
            key = file_key(rank, name)
            entry = meta["files"].get(key)
            if entry is None:
                raise PartitionError(f"{root / 'meta.json'} lists no file {key}")
            check_file(root, key, entry, verify_checksum=True)
    return GraphShape.from_meta(meta)


def format_table(
    graph: GraphShape, preds: list[Prediction], headings: dict[str, str] | None = None
) -> list[str]:
    """One line per rank: sizes, the terms in MiB, the total and where the peak falls.

    Args:
        graph: the partition's sizes.
        preds: every rank's prediction.
        headings: column headings of the terms (default :data:`SHORT`).
    """
    sizes = [[str(q.num_inner), str(q.num_halo), str(q.num_edges)] for q in graph.parts]
    return size_table(["inner", "halo", "edges"], sizes, preds, headings)


def describe(cfg: TrainConfig) -> str:
    """The model in a few words."""
    comp = f"fwd {cfg.compress_fwd} bwd {cfg.compress_bwd}"
    if cfg.error_feedback:
        comp += " + error feedback"
    return (
        f"model {cfg.model} L={cfg.layers} H={cfg.hidden}, dropout {cfg.dropout} (input "
        f"{cfg.resolved_input_dropout()}), exchange buffer {cfg.exchange_buffer_mb:g} MiB, "
        f"compression {comp}"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand."""
    p = subparsers.add_parser(
        "plan",
        help="predict every rank's peak memory for a partition and model, before running",
        description=(
            "Predicted peak training memory of every rank, term by term, and whether the "
            "ranks of each node fit its memory (--predict: the peak of `fullgraph predict` "
            "with the model). Reads the partition's sizes (every file is "
            "checked against its checksum), or with --dataset / --synthetic the whole graph "
            "of a one-process run, and measures the process floor by training the "
            "same model for two epochs on a 64-node graph in this process (seconds; "
            "--floor-mb gives it instead); nothing is written. `fullgraph plan minibatch "
            "...` plans a `fullgraph minibatch` run (see `fullgraph plan minibatch --help`)."
        ),
    )
    from fullgraph.commands import plan_minibatch, plan_partition, plan_project
    from fullgraph.run.options import add_options

    add_options(
        p,
        ("data (one of)", PlanData, ("no_verify",)),
        ("plan", PlanOptions, ()),
        ("model and optimiser", TrainConfig, ("epochs", "metric")),
    )
    p.set_defaults(func=run_plan)
    kinds = p.add_subparsers(
        dest="plan_kind", metavar="[minibatch|project|partition]", action=OptionsAfter
    )
    plan_minibatch.register(kinds)
    plan_project.register(kinds)
    plan_partition.register(kinds)


class OptionsAfter(argparse._SubParsersAction):
    """``fullgraph plan``'s run kinds (``minibatch``), with the options of the kind after its
    name: one given before it (``fullgraph plan --hidden 64 minibatch``) is refused in one line
    rather than silently replaced by the kind's default."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: list[str],
        option_string: str | None = None,
    ) -> None:
        """Refuse options given before the kind, then parse the kind's own."""
        given = [
            a.option_strings[0]
            for a in parser._actions
            if a.option_strings and a.dest != "help" and getattr(namespace, a.dest) != a.default
        ]
        if given:
            parser.error(
                f"{', '.join(given)} given before `{values[0]}`: the options of "
                f"`{parser.prog} {values[0]}` go after it"
            )
        super().__call__(parser, namespace, values, option_string)


def _shape(data: PlanData, cfg: TrainConfig) -> tuple[GraphShape, str]:
    """The planned run's shape and how to name its data: a partition's, every file verified,
    or the whole graph's, read as ``fullgraph train`` reads it (one process); every part
    passed the check the layer kind makes of it before training (:func:`_part_check`)."""
    check = _part_check(cfg)
    if data.parts is not None:
        shape = verified_shape(data.parts)
        if check is not None:  # one part at a time, memory-mapped, as each rank would
            from fullgraph.partition import load_partition

            for rank in range(shape.num_parts):
                check(load_partition(data.parts, rank))
        return shape, f"{data.parts}"
    part = data.load_part(None, 0, cfg.seed)
    if check is not None:
        check(part)
    shape = GraphShape.from_part(part, data.label)
    del part
    named = f"--dataset {data.dataset} --root {data.root}" if data.dataset else data.label
    return shape, f"the whole graph in one process, {named}"


def _part_check(cfg: TrainConfig) -> Callable[[Partition], None] | None:
    """The check ``fullgraph train`` makes of every part under the run's layer options (GCN's
    weighted degrees), so that the plan of a run training would refuse is refused alike."""
    return cfg.layer_kind().part_check(cfg.layer_options())


def _floor(cfg: TrainConfig, graph: GraphShape, ranks_per_node: int) -> int:
    """The process floor measured in this process, set up as a rank would be."""
    from fullgraph.resources import process_defaults, release_freed_memory

    process_defaults()
    from fullgraph.kernels.cpu_launch import set_threads

    release_freed_memory()
    set_threads(max(1, (os.cpu_count() or 1) // ranks_per_node))
    if graph.num_parts > 1:
        try:  # a rank of a multi-rank job has MPI started
            from mpi4py import MPI  # noqa: F401
        except ImportError:
            pass
    return measure_floor(cfg, graph.num_features, graph.num_classes)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph plan``; returns the exit status."""
    opts = PlanOptions.from_args(args)
    data = PlanData.from_args(args)
    cfg = TrainConfig.from_args(args)
    check_modelled(cfg)
    graph, named = _shape(data, cfg)
    per_node = opts.ranks_per_node or graph.num_parts
    node_memory = int(opts.node_memory * GIB) if opts.node_memory else machine_memory_bytes()
    shared = 0  # the floor's libraries, once per node: known when it is measured here
    if opts.floor_mb is not None:
        floor, source = int(opts.floor_mb * MIB), "given"
    else:  # the probe runs the model: not one whose sizes cannot fit (--hidden 10000000)
        floor, source = current_rss_bytes(), "this process now; not measured, a node cannot fit"
        if all(
            nf.fits for nf in node_fits(predict_quickly(graph, cfg, floor), per_node, node_memory)
        ):
            floor, source = _floor(cfg, graph, per_node), "measured"
            shared = min(file_backed_rss_bytes(), floor)
    mode = "predict" if opts.predict else "train"
    preds = predict_quickly(graph, cfg, floor, mode)
    print(
        f"fullgraph plan: {graph.dataset}, {graph.num_parts} part(s) ({named}), "
        f"{describe(cfg)}; process floor {mib(floor)} MiB ({source})"
    )
    what = "`fullgraph predict`" if opts.predict else "training"
    print(f"predicted peak resident memory per rank of {what}, MiB:")
    headings = {**SHORT, "optimizer": "parameters"} if opts.predict else SHORT
    for line in format_table(graph, preds, headings):
        print("  " + line)
    if graph.edge_weight or graph.edge_dim:  # read with the part, gone with it after set-up
        what = ["edge weights + weighted degrees"] if graph.edge_weight else []
        what += [f"{graph.edge_dim}-wide edge features"] if graph.edge_dim else []
        most = max(graph.edge_value_bytes(p) for p in graph.parts)
        print(
            f"stored edge values ({', '.join(what)}): up to {mib(most)} MiB per rank, in the "
            f"structure term while the rank sets up (not at the peak when it lies later)"
        )
    if opts.predict:
        trained = predict_quickly(graph, cfg, floor)
        worst = max(range(len(preds)), key=lambda r: preds[r].total / max(trained[r].total, 1))
        print(
            f"training the same model peaks at {mib(max(t.total for t in trained))} MiB on its "
            f"largest rank (predict: {mib(max(p.total for p in preds))} MiB); predict / training "
            f"at most {preds[worst].total / max(trained[worst].total, 1):.2f} (rank {worst})"
        )
    print_fits(preds, per_node, node_memory, "a narrower model or halo compression", shared)
    return 0
