"""``fullgraph plan minibatch``: the predicted peak of every rank of a ``fullgraph minibatch`` run.

``fullgraph plan minibatch --dataset NAME --root DIR --ranks P [--ranks-per-node K]`` with the
options of ``fullgraph minibatch`` reads the dataset's sizes as the run reads the graph
(memory-mapped where it has a processed cache), predicts every rank's peak by the estimate
``fullgraph minibatch`` checks at start (:func:`~fullgraph.memory.minibatch.predict_minibatch`,
a lower bound: the sampled blocks of a step are not counted) and says, for every node, whether
its ranks fit its memory; a node that does not fit ends the command with one line and exit
status 2. The process floor is this process's resident memory once the graph is read, as at the
run's own check (``--floor-mb`` gives it instead). Nothing is written (but the dataset's
``processed/`` cache, which the loader writes on the first read of a dataset, as the run does).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fullgraph.commands.plan_table import PlanOptions, print_fits, size_table
from fullgraph.config import Config, number, option
from fullgraph.memory.plan import GIB, MIB, machine_memory_bytes, mib
from fullgraph.minibatch.config import MinibatchConfig, MinibatchData


@dataclass
class MinibatchPlanOptions(Config):
    """The ranks of the planned ``fullgraph minibatch`` run."""

    ranks: int = option(
        1,
        "ranks of the run (mpirun -n P; every rank reads the whole graph)",
        check=number(low=1, integer=True),
        metavar="P",
    )


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``minibatch`` to ``fullgraph plan``'s run kinds."""
    from fullgraph.run.options import add_options

    p = kinds.add_parser(
        "minibatch",
        help="plan a `fullgraph minibatch` run",
        description=(
            "Predicted peak memory of every rank of a `fullgraph minibatch` run (the mini-batch "
            "baseline, GraphSAGE with neighbour sampling), term by term, and whether the ranks "
            "of each node fit its memory. Reads the dataset's sizes (memory-mapped); the "
            "estimate is the one the run checks at start, a lower bound (the sampled blocks of "
            "a step are not counted). Nothing is written. Example: fullgraph plan minibatch "
            "--dataset cora --root data --ranks 2 --fanouts 15,10,5"
        ),
    )
    add_options(
        p,
        ("data", MinibatchData, ()),
        ("plan", MinibatchPlanOptions, ()),
        ("plan", PlanOptions, ("predict",)),
        # all of the run's own (a `fullgraph minibatch` command line plans as it is); the
        # estimate reads the widths, the depth and the dropout
        ("model, sampling and optimiser", MinibatchConfig, ()),
    )
    p.set_defaults(func=run_minibatch_plan)


def run_minibatch_plan(args: argparse.Namespace) -> int:
    """Handler of ``fullgraph plan minibatch``; returns the exit status."""
    from fullgraph.datasets import load, require_features
    from fullgraph.memory.minibatch import predict_minibatch
    from fullgraph.memory.model import current_rss_bytes
    from fullgraph.minibatch.inference import row_range

    data = MinibatchData.from_args(args)
    ranks = MinibatchPlanOptions.from_args(args).ranks
    opts = PlanOptions.from_args(args)
    cfg = MinibatchConfig.from_args(args)
    graph = load(data.dataset, data.root, mmap=True, split=data.split)
    require_features(graph)
    per_node = min(opts.ranks_per_node or ranks, ranks)
    node_memory = int(opts.node_memory * GIB) if opts.node_memory else machine_memory_bytes()
    if opts.floor_mb is not None:
        floor, source = int(opts.floor_mb * MIB), "given"
    else:
        floor, source = current_rss_bytes(), "this process with the graph read, a lower bound"
    preds = predict_minibatch(
        graph.num_nodes,
        graph.num_edges,
        graph.num_features,
        graph.num_classes,
        cfg,
        ranks,
        per_node,
        floor,
    )
    print(
        f"fullgraph plan minibatch: {graph.name}, {ranks} rank(s) ({graph.num_nodes} nodes, "
        f"{graph.num_edges} edges, every rank reading the whole graph), model sage "
        f"L={len(cfg.fanouts)} H={cfg.hidden}, fanouts {','.join(map(str, cfg.fanouts))}, batch "
        f"size {cfg.batch_size}; process floor {mib(floor)} MiB ({source})"
    )
    print("predicted peak resident memory per rank of `fullgraph minibatch` (a lower bound), MiB:")
    rows = []
    for rank in range(ranks):
        lo, hi = row_range(graph.num_nodes, rank, ranks)
        rows.append([str(hi - lo), "yes" if rank % per_node == 0 else "shared"])
    for line in size_table(["eval rows", "graph"], rows, preds):
        print("  " + line)
    print_fits(preds, per_node, node_memory, "a narrower model (--hidden)")
    return 0
