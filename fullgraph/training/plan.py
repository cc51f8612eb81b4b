"""``fullgraph plan``: the predicted peak memory of every rank, before anything runs.

Reads a partition's ``meta.json`` and verifies every part file against its checksum
(read-only; a failing directory is refused with one line, exit 2), then prints, for every rank,
the peak the memory model predicts (:mod:`fullgraph.training.memory_model`) split into its
terms, and for every node (``--ranks-per-node`` consecutive ranks, as ``mpirun`` places them)
whether its ranks fit its memory (``--node-memory``, default this machine's). A node that does
not fit ends the command with one line and exit status 2. The model options are
``fullgraph train``'s own (:class:`~fullgraph.training.config.TrainConfig`). Nothing is written.

``fullgraph train`` makes the same prediction before it allocates anything by the model's sizes
and refuses a launch with a node that would not fit, exit status 2, unless
``--memory-check warn`` (or ``off``) says otherwise; it prints rank 0's line of the table at
start (:class:`StartupPlan`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from fullgraph.config import Config, number, option
from fullgraph.errors import ConfigError
from fullgraph.training.config import TrainConfig
from fullgraph.training.memory_model import (
    TERMS,
    GraphShape,
    Prediction,
    check_modelled,
    current_rss_bytes,
    measure_floor,
    predict_quickly,
)

MIB, GIB = 2**20, 2**30
#: Column headings of the terms in the table (same order as :data:`TERMS`).
SHORT = {
    "structure": "structure",
    "features": "features",
    "saved": "saved",
    "working": "temporaries",
    "halo": "halo bufs",
    "optimizer": "grad+optim",
    "compression": "residuals",
    "floor": "floor",
}


@dataclass
class PlanOptions(Config):
    """What ``fullgraph plan`` looks at besides the model: the parts and the nodes."""

    parts: str | None = option(None, "partition directory written by `fullgraph partition`")
    ranks_per_node: int | None = option(
        None,
        "ranks on each node, consecutive ranks together (default: all on one node)",
        check=number(low=1, integer=True, optional=True),
        metavar="K",
    )
    node_memory: float | None = option(
        None,
        "memory of one node in GiB (default: this machine's total memory, or this process's "
        "cgroup limit when lower)",
        check=number(low=0.0, low_open=True, optional=True),
        metavar="GIB",
    )
    floor_mb: float | None = option(
        None,
        "process floor of a rank in MiB (default: measured now, by training the same model "
        "for two epochs on a 64-node graph in this process)",
        check=number(low=0.0, optional=True),
        metavar="MB",
    )

    def check(self) -> None:
        """``--parts`` is required."""
        if not self.parts or not str(self.parts).strip():
            raise ConfigError(
                "--parts DIR is required (a directory written by `fullgraph partition`)"
            )


def machine_memory_bytes() -> int:
    """This machine's memory, bytes: ``MemTotal`` of ``/proc/meminfo``, or this process's
    control group's limit when lower (:func:`fullgraph.resources.node_memory_bytes`)."""
    from fullgraph.resources import node_memory_bytes

    return node_memory_bytes()


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


@dataclass
class NodeFit:
    """The ranks of one node and whether their predicted peaks fit its memory."""

    node: int
    ranks: list[int]
    need: int
    have: int

    @property
    def fits(self) -> bool:
        """Whether the predicted peaks add up to at most the node's memory."""
        return self.need <= self.have


def node_fits(preds: list[Prediction], ranks_per_node: int, node_memory: int) -> list[NodeFit]:
    """Consecutive ``ranks_per_node`` ranks per node (mpirun's default placement)."""
    out = []
    for start in range(0, len(preds), ranks_per_node):
        group = preds[start : start + ranks_per_node]
        out.append(
            NodeFit(
                node=start // ranks_per_node,
                ranks=[p.rank for p in group],
                need=sum(p.total for p in group),
                have=node_memory,
            )
        )
    return out


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.0f}"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def format_table(graph: GraphShape, preds: list[Prediction]) -> list[str]:
    """One line per rank: sizes, the terms in MiB, the total and where the peak falls."""
    head = ["rank", "inner", "halo", "edges"] + [SHORT[t] for t in TERMS] + ["total", "peak in"]
    rows = [head]
    for part, p in zip(graph.parts, preds, strict=True):
        rows.append(
            [str(p.rank), str(part.num_inner), str(part.num_halo), str(part.num_edges)]
            + [_mib(p.terms[t]) for t in TERMS]
            + [_mib(p.total), p.phase]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    return [
        "  ".join(c.rjust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]


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
            "ranks of each node fit its memory. Reads the partition's sizes (every file is "
            "checked against its checksum) and measures the process floor by training the "
            "same model for two epochs on a 64-node graph in this process (seconds; "
            "--floor-mb gives it instead); nothing is written."
        ),
    )
    from fullgraph.training.job import add_options

    plan = p.add_argument_group("plan")
    plan.add_argument(
        "--parts",
        required=True,
        metavar="DIR",
        help="partition directory written by `fullgraph partition` (or its meta.json)",
    )
    PlanOptions.add_arguments(plan, exclude=("parts",))
    add_options(p, ("model and optimiser", TrainConfig, ("epochs",)))
    p.set_defaults(func=run_plan)


def _floor(cfg: TrainConfig, graph: GraphShape, ranks_per_node: int) -> int:
    """The process floor measured in this process, set up as a rank would be."""
    from fullgraph.resources import process_defaults, release_freed_memory

    process_defaults()
    import numba
    import torch

    release_freed_memory()
    threads = max(1, (os.cpu_count() or 1) // ranks_per_node)
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    if graph.num_parts > 1:
        try:  # a rank of a multi-rank job has MPI started
            from mpi4py import MPI  # noqa: F401
        except ImportError:
            pass
    return measure_floor(cfg, graph.num_features, graph.num_classes)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph plan``; returns the exit status."""
    opts = PlanOptions.from_args(args)
    cfg = TrainConfig.from_args(args)
    check_modelled(cfg)
    graph = verified_shape(opts.parts)
    per_node = opts.ranks_per_node or graph.num_parts
    node_memory = int(opts.node_memory * GIB) if opts.node_memory else machine_memory_bytes()
    if opts.floor_mb is not None:
        floor, source = int(opts.floor_mb * MIB), "given"
    else:  # the probe runs the model: not one whose sizes cannot fit (--hidden 10000000)
        floor, source = current_rss_bytes(), "this process now; not measured, a node cannot fit"
        if all(nf.fits for nf in node_fits(predict_quickly(graph, cfg, floor), per_node,
                                           node_memory)):  # fmt: skip
            floor, source = _floor(cfg, graph, per_node), "measured"
    preds = predict_quickly(graph, cfg, floor)
    print(
        f"fullgraph plan: {graph.dataset}, {graph.num_parts} part(s) ({opts.parts}), "
        f"{describe(cfg)}; process floor {_mib(floor)} MiB ({source})"
    )
    print("predicted peak resident memory per rank, MiB:")
    for line in format_table(graph, preds):
        print("  " + line)
    fits = node_fits(preds, per_node, node_memory)
    for nf in fits:
        verdict = "fits" if nf.fits else "does NOT fit"
        print(
            f"node {nf.node} ({_ranks(nf.ranks)}): {nf.need / GIB:.2f} GiB of "
            f"{nf.have / GIB:.2f} GiB: {verdict}"
        )
    sys.stdout.flush()
    bad = [nf for nf in fits if not nf.fits]
    if bad:
        worst = max(bad, key=lambda nf: nf.need - nf.have)
        raise ConfigError(
            f"does not fit: node {worst.node} ({_ranks(worst.ranks)}) needs "
            f"{worst.need / GIB:.2f} GiB of {worst.have / GIB:.2f} GiB; use more ranks, "
            f"fewer per node (--ranks-per-node), a narrower model or halo compression"
        )
    return 0


#: ``--memory-check`` (``fullgraph train`` and ``minibatch``): what a run does when the
#: predicted peak of a node's ranks exceeds its memory.
MEMORY_CHECKS = ("refuse", "warn", "off")


#: What a refusal of ``fullgraph train`` suggests.
TRAIN_ADVICE = (
    "use more ranks, fewer per node, a narrower model or halo compression (`fullgraph plan` "
    "shows every rank)"
)


def memory_verdict(fits: list[NodeFit], check: str, advice: str = TRAIN_ADVICE) -> list[str]:
    """Refuse (``check == "refuse"``) or warn about the nodes that would not fit.

    Returns:
        A ``warning:`` line per node that would not fit (``warn``), else none.

    Raises:
        ConfigError: ``refuse`` and a node would not fit: one line naming the node's predicted
            peak, its memory and the option that runs anyway.
    """
    bad = [nf for nf in fits if not nf.fits]
    if check == "refuse" and bad:
        worst = max(bad, key=lambda nf: nf.need - nf.have)
        raise ConfigError(
            f"memory plan: node {worst.node} ({_ranks(worst.ranks)}) would need "
            f"{worst.need / GIB:.2f} GiB at the predicted peak, more than this machine's "
            f"{worst.have / GIB:.2f} GiB; {advice}, or --memory-check warn to run anyway"
        )
    return [
        f"warning: memory plan: node {nf.node} ({_ranks(nf.ranks)}) would need "
        f"{nf.need / GIB:.2f} GiB of this machine's {nf.have / GIB:.2f} GiB"
        + (" (`fullgraph plan` shows every rank)" if advice == TRAIN_ADVICE else "")
        for nf in bad
    ]


class StartupPlan:
    """``fullgraph train``'s memory plan, on rank 0: sizes checked before anything large.

    1. :meth:`check_sizes`, as soon as the graph's sizes are known (the partition's
       ``meta.json``; a one-process run's graph once loaded) and before anything that
       allocates by the model's sizes: the prediction (:func:`~fullgraph.training.
       memory_model.predict_quickly`, no tensor built) with this process's resident memory as
       the floor, a lower bound of the measured one. An absurd width, head or layer count
       (``--hidden 10000000``, ``--heads 100000``, ``--layers 100000``) ends here, in seconds,
       by the same rule as any run too large for its nodes: no caps.
    2. :meth:`measure_floor`: the floor probe (a two-epoch run of the same model on a 64-node
       graph, :func:`~fullgraph.training.memory_model.measure_floor`), skipped when step 1
       already found a node that does not fit.
    3. :meth:`report`: the prediction with the measured floor; rank 0's line, and the same
       refusal or warnings.

    ``check`` (``--memory-check``): ``refuse`` (the default; exit status 2), ``warn`` (a
    warning line, and the run goes on), ``off`` (no prediction, no probe). Every node is taken
    to have this machine's memory (:func:`machine_memory_bytes`), shared by
    ``ranks_per_node`` consecutive ranks.

    Args:
        cfg: the run's configuration.
        check: one of :data:`MEMORY_CHECKS`.
        ranks_per_node: ranks on each node of the launch.
    """

    def __init__(self, cfg: TrainConfig, check: str, ranks_per_node: int) -> None:
        self.cfg, self.check, self.per_node = cfg, check, max(1, ranks_per_node)
        self.unmodelled = ""
        try:
            check_modelled(cfg)
        except ConfigError as exc:
            self.unmodelled = str(exc)
        #: this process before it loads anything: the floor's lower bound
        self.resident = current_rss_bytes()
        self.floor = self.resident
        self.fits = True

    @property
    def active(self) -> bool:
        """Whether there is a prediction to make (checked, and the model covered)."""
        return self.check != "off" and not self.unmodelled

    def _fits(self, graph: GraphShape) -> tuple[list[Prediction], list[NodeFit]]:
        preds = predict_quickly(graph, self.cfg, self.floor)
        fits = node_fits(preds, self.per_node, machine_memory_bytes())
        self.fits = all(nf.fits for nf in fits)
        return preds, fits

    def check_sizes(self, graph: GraphShape) -> None:
        """Step 1 (see the class docstring), before any probe (with ``warn`` the warnings come
        from :meth:`report`).

        Raises:
            ConfigError: ``refuse`` and a node would not fit.
        """
        if self.active:
            memory_verdict(self._fits(graph)[1], self.check)

    def measure_floor(self, num_features: int, num_classes: int) -> None:
        """Step 2: the process floor, without what this process loaded since it started."""
        if not self.active or not self.fits:
            return
        before = current_rss_bytes()
        after = measure_floor(self.cfg, num_features, num_classes)
        self.floor = self.resident + max(0, after - before)

    def report(self, graph: GraphShape) -> list[str]:
        """Step 3: rank 0's predicted peak, and the refusal or warnings.

        Returns:
            Lines to print: ``memory plan: ...`` and ``warning: ...`` lines (one line saying
            so when the model is not covered; none with ``--memory-check off``).

        Raises:
            ConfigError: ``refuse`` and a node would not fit.
        """
        if self.check == "off":
            return []
        if self.unmodelled:
            return [f"memory plan: none ({self.unmodelled})"]
        preds, fits = self._fits(graph)
        p0 = preds[0]
        terms = ", ".join(f"{TERMS[t]} {_mib(v)}" for t, v in p0.terms.items() if v)
        line = f"memory plan: rank 0 peak {_mib(p0.total)} MiB in {p0.phase} ({terms} MiB)"
        return [line, *memory_verdict(fits, self.check)]


def check_minibatch(graph: Any, cfg: Any, ranks: int, ranks_per_node: int, check: str) -> list[str]:
    """``fullgraph minibatch``'s memory check, on rank 0 once the graph is loaded (memory-mapped)
    and before the model is built: the estimate of
    :func:`~fullgraph.training.memory_model_minibatch.predict_minibatch` (a lower bound) with
    this process's resident memory as the floor, against this machine's memory.

    Args:
        graph: the loaded :class:`~fullgraph.datasets.Graph`.
        cfg: the run's :class:`~fullgraph.minibatch.config.MinibatchConfig`.
        ranks: ranks of the run.
        ranks_per_node: ranks on each node.
        check: ``--memory-check`` (:data:`MEMORY_CHECKS`).

    Returns:
        ``warning:`` lines (``warn``), else none.

    Raises:
        ConfigError: ``refuse`` and a node would not fit.
    """
    if check == "off":
        return []
    from fullgraph.training.memory_model_minibatch import predict_minibatch

    per_node = max(1, ranks_per_node)
    preds = predict_minibatch(graph.num_nodes, graph.num_edges, graph.num_features,
                              graph.num_classes, cfg, ranks, per_node,
                              current_rss_bytes())  # fmt: skip
    advice = "use a narrower model (--hidden), more ranks or fewer per node"
    return memory_verdict(node_fits(preds, per_node, machine_memory_bytes()), check, advice)
