"""``fullgraph plan``: the predicted peak memory of every rank, before anything runs.

Reads a partition's ``meta.json`` and verifies every part file against its checksum
(read-only; a failing directory is refused with one line, exit 2), then prints, for every rank,
the peak the memory model predicts (:mod:`fullgraph.training.memory_model`) split into its
terms, and for every node (``--ranks-per-node`` consecutive ranks, as ``mpirun`` places them)
whether its ranks fit its memory (``--node-memory``, default this machine's). A node that does
not fit ends the command with one line and exit status 2. The model options are
``fullgraph train``'s own (:class:`~fullgraph.training.config.TrainConfig`). Nothing is written.

``fullgraph train`` prints rank 0's line of the same table at start and warns when a node of
its launch would not fit (:func:`startup_report`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from fullgraph.config import Config, number, option
from fullgraph.errors import ConfigError
from fullgraph.training.config import TrainConfig
from fullgraph.training.memory_model import (
    TERMS,
    GraphShape,
    Prediction,
    check_modelled,
    measure_floor,
    predict,
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
        "memory of one node in GiB (default: this machine's total memory)",
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
    """This machine's total memory (``MemTotal`` of ``/proc/meminfo``), bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


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
            "ranks of each node fit its memory. Reads only the partition's metadata (every "
            "file is checked against its checksum); nothing is written."
        ),
    )
    from fullgraph.training.job import add_options

    add_options(p, ("plan", PlanOptions, ()), ("model and optimiser", TrainConfig, ("epochs",)))
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
        floor = int(opts.floor_mb * MIB)
    else:
        floor = _floor(cfg, graph, per_node)
    preds = predict(graph, cfg, floor)
    print(
        f"fullgraph plan: {graph.dataset}, {graph.num_parts} part(s) ({opts.parts}), "
        f"{describe(cfg)}; process floor {_mib(floor)} MiB "
        f"({'given' if opts.floor_mb is not None else 'measured'})"
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


def startup_floor(cfg: TrainConfig, meta: dict | None) -> int:
    """``fullgraph train``'s process floor, measured on rank 0 before it loads its part
    (0 when the configuration is not modelled). A one-process run does not know its widths
    yet: the probe then uses 16 features and 4 classes (the floor is code and pools)."""
    try:
        check_modelled(cfg)
    except ConfigError:
        return 0
    if meta is None:
        return measure_floor(cfg, 16, 4)
    return measure_floor(cfg, int(meta["num_features"]), int(meta["num_classes"]))


def startup_report(
    graph: GraphShape, cfg: TrainConfig, ranks_per_node: int, floor: int
) -> list[str]:
    """What ``fullgraph train`` prints at start on rank 0: rank 0's predicted peak, and a
    warning line (prefixed ``warning:``) for every node of the launch that would not fit.

    Args:
        graph: the partition's shape.
        cfg: the run's configuration.
        ranks_per_node: ranks on each node of the launch.
        floor: the process floor (:func:`startup_floor`).

    Returns:
        Lines to print (one saying so when the configuration is not modelled).
    """
    try:
        check_modelled(cfg)
    except ConfigError as exc:
        return [f"memory plan: none ({exc})"]
    preds = predict(graph, cfg, floor)
    p0 = preds[0]
    terms = ", ".join(f"{TERMS[t]} {_mib(v)}" for t, v in p0.terms.items() if v)
    lines = [f"memory plan: rank 0 peak {_mib(p0.total)} MiB in {p0.phase} ({terms} MiB)"]
    for nf in node_fits(preds, max(1, ranks_per_node), machine_memory_bytes()):
        if not nf.fits:
            lines.append(
                f"warning: memory plan: node {nf.node} ({_ranks(nf.ranks)}) would need "
                f"{nf.need / GIB:.2f} GiB of this machine's {nf.have / GIB:.2f} GiB "
                f"(`fullgraph plan` shows every rank)"
            )
    return lines
