"""``fullgraph plan project``: the plan of a graph too large to run here, on many machines.

``fullgraph plan project --preset papers100M --machines 16,32,64,128 [--ranks-per-machine K]``
with ``fullgraph train``'s model options describes the graph's published sizes cut into equal
parts (:func:`~fullgraph.memory.projection.described_shape`; the halo is the stated
assumption of ``--halo-ratio`` / ``--halo-growth``) and prints, for every machine count, the
memory per rank and per machine (the memory model's replay), the halo rows and bytes a rank
sends a training step (the replay's own exchanges) and the predicted epoch time: per-edge,
per-row and per-halo-row costs of this model measured by a short probe
(:func:`~fullgraph.memory.cost_probe.probe_costs`: the real trainer on random graphs, in this
process and in a two-rank ``mpirun`` run; ``--edge-ns`` / ``--row-us`` / ``--halo-row-us`` give
them instead) and what a rank sends at
``--bandwidth``. ``--parts DIR`` projects a partition on disk instead (the sizes its
``meta.json`` holds, one line per rank): what ``bench/projection_check.py`` measures against.
Nothing is written.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fullgraph.config import Config, number, option
from fullgraph.errors import ConfigError
from fullgraph.memory.plan import GIB, MIB
from fullgraph.training.config import TrainConfig

if TYPE_CHECKING:
    from fullgraph.memory.projection import Costs, RankProjection
    from fullgraph.memory.shapes import GraphShape


def parse_machines(text: str) -> list[int]:
    """``"16,32,64"`` -> ``[16, 32, 64]``.

    Raises:
        ConfigError: an entry is not an integer or is below 1.
    """
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--machines must be comma-separated integers, got {text!r}") from None
    if not counts or any(c <= 0 for c in counts):
        raise ConfigError(f"--machines needs counts >= 1, got {text!r}")
    return counts


def _check_machines(option_name: str, value: list[int]) -> None:
    if not value or any(not isinstance(c, int) or c <= 0 for c in value):
        raise ConfigError(f"{option_name} needs counts >= 1, got {value}")


@dataclass
class ProjectOptions(Config):
    """What is projected, onto which machines, at which costs."""

    preset: str | None = option(
        None,
        "the graph's published sizes: papers100M, products or arxiv (ogbn-*)",
        metavar="NAME",
    )
    parts: str | None = option(
        None, "a partition written by `fullgraph partition`: its own sizes", metavar="DIR"
    )
    machines: list[int] = option(
        [16, 32, 64, 128],
        "machine counts to project to (--preset)",
        parse=parse_machines,
        check=_check_machines,
    )
    ranks_per_machine: int = option(
        1, "ranks on each machine", check=number(low=1, integer=True), metavar="K"
    )
    halo_ratio: float = option(
        1.0, "halo rows per inner row at --halo-parts parts (--preset)", check=number(low=0.0)
    )
    halo_growth: float = option(
        0.5, "the halo ratio grows as P ^ this (--preset)", check=number(low=0.0)
    )
    halo_parts: int = option(
        16, "the part count --halo-ratio holds at", check=number(low=1, integer=True)
    )
    halo_edges_per_row: float = option(
        1.7, "halo edges per halo row (--preset)", check=number(low=0.0)
    )
    bandwidth: float = option(
        12.5,
        "GB/s one rank sends at (12.5: 100 Gb/s)",
        check=number(low=0.0, low_open=True),
        metavar="GBPS",
    )
    edge_ns: float | None = option(
        None,
        "ns of a training step per stored edge (with --row-us; default: measured now)",
        check=number(low=0.0, optional=True),
    )
    row_us: float | None = option(
        None,
        "us of a training step per inner row (with --edge-ns; default: measured now)",
        check=number(low=0.0, optional=True),
    )
    halo_row_us: float | None = option(
        None,
        "us of a training step per halo row sent or received (with --edge-ns; default 0)",
        check=number(low=0.0, optional=True),
    )
    no_halo_probe: bool = option(
        False,
        "measure no per-halo-row cost (it takes a two-rank `mpirun` run on this machine)",
    )
    threads: int | None = option(
        None,
        "threads of a rank while the costs are measured (default: this machine's cores / K)",
        check=number(low=1, integer=True, optional=True),
    )
    probe_parts: str | None = option(
        None,
        "measure the per-edge and per-row costs on this partition's part 0 (a graph like the "
        "one projected; default: --parts, else random graphs, an upper bound)",
        metavar="DIR",
    )
    probe_rows: int | None = option(
        None,
        "rows of the cost probe's graphs (default: a part's, at most 262144)",
        check=number(low=64, integer=True, optional=True),
    )
    probe_steps: int = option(
        3,
        "timed training steps per probe graph (the fastest counts)",
        check=number(low=1, integer=True),
    )
    floor_mb: float | None = option(
        None,
        "process floor of a rank in MiB (default: measured now, as `fullgraph plan` does)",
        check=number(low=0.0, optional=True),
        metavar="MB",
    )

    def check(self) -> None:
        """One source; costs given together or not at all."""
        if (self.preset is None) == (self.parts is None):
            raise ConfigError("give one of --preset NAME (papers100M, ...) or --parts DIR")
        if (self.edge_ns is None) != (self.row_us is None):
            raise ConfigError("--edge-ns and --row-us go together (or neither: measured now)")
        if self.halo_row_us is not None and self.edge_ns is None:
            raise ConfigError("--halo-row-us goes with --edge-ns and --row-us")
        if self.preset is not None:
            from fullgraph.memory.projection import preset

            preset(self.preset)


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``project`` to ``fullgraph plan``'s run kinds."""
    from fullgraph.run.options import add_options

    p = kinds.add_parser(
        "project",
        help="project the plan to a large graph on many machines (memory, halo, epoch time)",
        description=(
            "Memory per rank and per machine, halo rows and bytes a rank sends a training "
            "step, and the predicted epoch time of `fullgraph train` on a graph described by "
            "its published sizes (--preset) cut into equal parts for every machine count "
            "(--machines), or on a partition on disk (--parts). Costs are measured now by a "
            "short probe (the model's training steps on random graphs, one process and two "
            "ranks) unless given. "
            "Nothing is written. Example: fullgraph plan project --preset papers100M "
            "--machines 16,32,64,128 --model sage --layers 3 --hidden 256"
        ),
    )
    add_options(
        p,
        ("projection", ProjectOptions, ()),
        ("model and optimiser", TrainConfig, ("epochs", "metric")),
    )
    p.set_defaults(func=run_project)


def _costs(opts: ProjectOptions, cfg: TrainConfig, graph: GraphShape, share: float) -> Costs:
    """The given costs, or the probe's on this machine now."""
    from fullgraph.memory.cost_probe import probe_costs, probe_rows
    from fullgraph.memory.projection import Costs

    bandwidth = opts.bandwidth * 1e9
    if opts.edge_ns is not None and opts.row_us is not None:
        halo = (opts.halo_row_us or 0.0) * 1e-6
        costs = Costs(opts.edge_ns * 1e-9, opts.row_us * 1e-6, bandwidth, halo_row_s=halo)
        costs.check()
        return costs
    threads = opts.threads or max(1, (os.cpu_count() or 1) // opts.ranks_per_machine)
    rows = opts.probe_rows or probe_rows(graph)
    return probe_costs(
        cfg,
        graph.num_features,
        graph.num_classes,
        threads=threads,
        rows=rows,
        steps=opts.probe_steps,
        train_share=share,
        bandwidth=bandwidth,
        halo=not opts.no_halo_probe and graph.num_parts > 1,
        parts=opts.probe_parts or opts.parts,
    )


def _floor(opts: ProjectOptions, cfg: TrainConfig, features: int, classes: int) -> int:
    if opts.floor_mb is not None:
        return int(opts.floor_mb * MIB)
    from fullgraph.memory.model import measure_floor

    return measure_floor(cfg, features, classes)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


def run_project(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph plan project``; returns the exit status."""
    from fullgraph.memory.model import check_modelled
    from fullgraph.memory.projection import HaloModel, described_shape, preset, project

    opts = ProjectOptions.from_args(args)
    cfg = TrainConfig.from_args(args)
    check_modelled(cfg)
    k = opts.ranks_per_machine
    if opts.parts is not None:
        from fullgraph.memory.shapes import GraphShape
        from fullgraph.partition.format import partition_root, read_meta

        # the sizes only (``fullgraph plan`` checks every file: nothing here reads them)
        shapes = [GraphShape.from_meta(read_meta(partition_root(opts.parts))[0])]
        if shapes[0].num_parts % k:
            raise ConfigError(f"{shapes[0].num_parts} parts do not fill machines of {k} ranks")
        total = sum(p.num_inner for p in shapes[0].parts)
        share = sum(p.num_train for p in shapes[0].parts) / max(total, 1)
        named = f"{opts.parts}"
    else:
        size = preset(opts.preset)
        halo = HaloModel(
            opts.halo_ratio, opts.halo_growth, opts.halo_parts, opts.halo_edges_per_row
        )
        shapes = [described_shape(size, m * k, halo) for m in opts.machines]
        share = size.num_train / size.num_nodes
        named = (
            f"{size.num_nodes} nodes, {2 * size.num_edges} stored edges, equal "
            f"parts, halo {opts.halo_ratio:g} x (P/{opts.halo_parts})^{opts.halo_growth:g} "
            f"rows a row, {opts.halo_edges_per_row:g} edges a halo row"
        )
    first = shapes[0]
    floor = _floor(opts, cfg, first.num_features, first.num_classes)
    biggest = max(shapes, key=lambda g: max(p.num_inner for p in g.parts))
    costs = _costs(opts, cfg, biggest, share)
    print(f"fullgraph plan project: {first.dataset} ({named})")
    print(
        f"model {cfg.model} L={cfg.layers} H={cfg.hidden}; floor {floor / MIB:.0f} MiB; costs "
        f"{costs.edge_s * 1e9:.2f} ns an edge, {costs.row_s * 1e6:.2f} us a row, "
        f"{costs.halo_row_s * 1e6:.2f} us a halo row, x{costs.shared:.2f} sharing a machine "
        f"({costs.source}); {costs.bandwidth / 1e9:g} GB/s a rank; {k} rank(s) a machine"
    )
    if opts.parts is not None:
        _print_ranks(project(first, cfg, floor, costs, k), k)
        return 0
    head = (
        "machines  ranks  rows/rank  halo/rank  GB/rank  GB/machine  halo rows/step  "
        "halo GB/step  compute s  halo s  epoch s  peak in"
    )
    print(head)
    for m, graph in zip(opts.machines, shapes, strict=True):
        r = project(graph, cfg, floor, costs, k)[0]
        print(
            f"{m:8d}  {m * k:5d}  {r.part.num_inner:9d}  {r.part.num_halo:9d}  "
            f"{_gb(r.memory.total):>7s}  {_gb(k * r.memory.total):>10s}  {r.halo_rows:14d}  "
            f"{_gb(r.halo_bytes):>12s}  {r.compute_s:9.2f}  {r.send_s:6.2f}  "
            f"{r.epoch_s:7.2f}  {r.memory.phase}"
        )
    print("halo: what one rank sends in one training step (every part alike); GB = 1e9 bytes")
    return 0


def _print_ranks(ranks: list[RankProjection], per_machine: int) -> None:
    """One line per rank of a partition on disk, then every machine's memory."""
    print(
        "rank  inner  halo  edges  MiB  halo rows/step  halo MiB/step  compute s  halo s  epoch s"
    )
    for r in ranks:
        print(
            f"{r.part.rank:4d}  {r.part.num_inner}  {r.part.num_halo}  {r.part.num_edges}  "
            f"{r.memory.total / MIB:.0f}  {r.halo_rows}  {r.halo_bytes / MIB:.1f}  "
            f"{r.compute_s:.3f}  {r.send_s:.3f}  {r.epoch_s:.3f}"
        )
    for m in range(len(ranks) // per_machine):
        mine = ranks[m * per_machine : (m + 1) * per_machine]
        need = sum(r.memory.total for r in mine)
        print(f"machine {m}: {need / GIB:.2f} GiB")
    print(f"predicted epoch (the slowest rank's step): {max(r.epoch_s for r in ranks):.3f} s")
