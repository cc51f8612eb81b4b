"""``fullgraph plan partition``: the predicted peak memory of ``fullgraph partition``.

``fullgraph plan partition --dataset NAME --root DIR --parts P [--method M] [--metis L]`` reads
the graph's sizes (memory-mapped: nothing of it is loaded), predicts the peak of each stage
(:mod:`fullgraph.memory.partition_peak`) and says whether it fits this machine's memory
(``--node-memory`` another's). ``fullgraph partition`` makes the same check before it
partitions and refuses a run that would not fit (``--memory-check``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fullgraph.errors import ConfigError
from fullgraph.memory.partition_peak import PartitionPeak, PartitionSizes, predict_partition

# not fullgraph.memory.plan / .model: they import torch, which a partition never needs (its
# start-up and floor would grow by torch's)
MIB, GIB = 2**20, 2**30


def mib(nbytes: float) -> str:
    """Bytes as whole MiB."""
    return f"{nbytes / MIB:.0f}"


def rss_bytes() -> int:
    """This process's resident memory now, bytes."""
    from fullgraph.resources import current_rss_mb

    return int(current_rss_mb() * MIB)


if TYPE_CHECKING:
    from fullgraph.datasets.graph import Graph

#: What a refusal suggests.
ADVICE = {
    "metis": "use --method kaminpar, a 32-bit libmetis (`make install`), or a machine with more "
    "memory",
    "kaminpar": "use a machine with more memory",
}


#: What ``fullgraph partition`` has imported before it reads the graph.
PARTITION_IMPORTS = (
    "import fullgraph.cli, fullgraph.commands.plan_partition, fullgraph.partition.build, "
    "fullgraph.datasets"
)


def partition_floor() -> int:
    """The resident memory of a ``fullgraph partition`` process before it reads the graph,
    measured in a fresh interpreter (``fullgraph plan`` itself has imported torch, which a
    partition never does), bytes."""
    import subprocess
    import sys

    code = f"{PARTITION_IMPORTS}; from fullgraph.commands.plan_partition import rss_bytes; "
    code += "print(rss_bytes())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return int(done.stdout.split()[-1])


def resolve_library(method: str, metis: str) -> str:
    """The METIS library ``--metis`` resolves to here (``libmetis``: a 32-bit one is
    installed; else ``pymetis``), or ``-`` for the other methods."""
    if method != "metis":
        return "-"
    if metis == "auto":
        from fullgraph.partition.libmetis import find_libmetis

        lib = find_libmetis()
        return "libmetis" if lib is not None and lib.bits == 32 else "pymetis"
    return metis


def plan_graph(
    graph: Graph, parts: int, method: str, metis: str, floor: int
) -> tuple[PartitionPeak, str]:
    """The predicted peaks of partitioning ``graph`` on top of ``floor`` (the process's
    resident bytes before the graph was read) and the METIS library planned for."""
    width = 4 if graph.x is None else int(graph.x.dtype.itemsize)
    sizes = PartitionSizes(graph.num_nodes, graph.num_edges, graph.num_features, width)
    library = resolve_library(method, metis)
    return predict_partition(sizes, parts, method, library, floor), library


def check_partition_memory(
    graph: Graph,
    parts: int,
    method: str,
    metis: str,
    check: str,
    floor: int,
    memory: int | None = None,
) -> str | None:
    """Refuse (``check == "refuse"``) a partition whose predicted peak (on top of ``floor``,
    the process's resident bytes before the graph was read) exceeds the machine's memory
    (``memory``: another's); a warning line instead under ``warn`` (``None``: it fits, or
    ``off``).

    Raises:
        ConfigError: one line naming the predicted peak, the memory and what to do.
    """
    if check == "off":
        return None
    from fullgraph.resources import node_memory_bytes

    have = node_memory_bytes() if memory is None else memory
    peak, library = plan_graph(graph, parts, method, metis, floor)
    if peak.needed <= have:
        return None
    what = f"{method} ({library})" if method == "metis" else method
    line = (
        f"memory plan: partitioning {graph.name} ({graph.num_nodes:,} nodes, "
        f"{graph.num_edges:,} edges) into {parts} parts with {what} would need "
        f"{peak.needed / GIB:.2f} GiB ({peak.stage}, besides the graph's mapped pages), more "
        f"than this machine's {have / GIB:.2f} GiB"
    )
    if check == "refuse":
        advice = ADVICE.get(method, "use a machine with more memory")
        raise ConfigError(f"{line}; {advice}, or --memory-check warn to run anyway")
    return f"warning: {line}"


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``fullgraph plan partition``."""
    p = kinds.add_parser(
        "partition",
        help="predict the peak memory of `fullgraph partition`",
        description=__doc__.split("\n\n")[1].replace("``", "`"),
    )
    p.add_argument("--dataset", required=True, help="dataset name")
    p.add_argument("--root", required=True, help="dataset root directory")
    p.add_argument("--parts", required=True, type=int, metavar="P", help="number of parts")
    p.add_argument(
        "--method", choices=["metis", "kaminpar", "random", "contiguous"], default="metis"
    )
    p.add_argument("--metis", choices=["auto", "libmetis", "pymetis"], default="auto")
    p.add_argument("--split", type=int, metavar="K", help="the dataset's fixed split")
    p.add_argument(
        "--node-memory",
        type=float,
        metavar="GIB",
        help="the machine's memory (default: this one's)",
    )
    p.set_defaults(func=run_plan_partition)


def run_plan_partition(args: argparse.Namespace) -> int:
    """Print the stage table and the verdict; exit 2 when it would not fit."""
    from fullgraph.datasets import load
    from fullgraph.partition.assign import check_num_parts
    from fullgraph.resources import node_memory_bytes

    floor = partition_floor()
    graph = load(args.dataset, args.root, mmap=True, split=args.split)
    check_num_parts(args.parts, graph.num_nodes)
    peak, library = plan_graph(graph, args.parts, args.method, args.metis, floor)
    have = int(args.node_memory * GIB) if args.node_memory else node_memory_bytes()
    what = f"{args.method} ({library})" if args.method == "metis" else args.method
    print(
        f"fullgraph plan partition: {graph.name} ({graph.num_nodes:,} nodes, "
        f"{graph.num_edges:,} stored edges, {graph.num_features} features) into {args.parts} "
        f"parts with {what}; predicted peak resident memory, MiB:"
    )
    print(f"  process floor {mib(peak.floor):>8}  (a partition process before reading the graph)")
    print(f"  assign        {mib(peak.assign):>8}  + {mib(peak.assign_mapped)} mapped")
    print(f"  build parts   {mib(peak.build):>8}  + {mib(peak.build_mapped)} mapped")
    print(
        f"  peak          {mib(peak.total):>8}  ({peak.stage}, mapped pages included; without "
        f"them {mib(peak.needed)}: what must fit in this machine's {mib(have)} MiB)"
    )
    if peak.needed > have:
        advice = ADVICE.get(args.method, "use a machine with more memory")
        raise ConfigError(
            f"memory plan: the partition would need {peak.needed / GIB:.2f} GiB, more than "
            f"{have / GIB:.2f} GiB; {advice}"
        )
    print("fits")
    return 0
