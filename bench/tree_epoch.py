"""The fp32 training step with the block tree (sums over nodes the same bits at any P) against
the same step with the rank-order all-reduce (``ctx.blocks = None``), interleaved step by step.

One process on the whole graph (``--nodes N``: an SBM graph of the tests, 128 features), or
``--parts DIR`` under ``mpirun -np P`` (a ``fullgraph partition`` blocks partition: rank r
trains part r). The two trainers alternate so both see the same load; the ratio of their
median step times is what to compare (a shared machine's absolute times drift). The rows are
block-contiguous at every P (the whole graph's in block order, as ``fullgraph partition
--parts 1`` writes them), so the tree's steps gather nothing into block order.

Usage::

    python -m bench.tree_epoch --nodes 20000 --model gcn
    python -c "from bench.tree_epoch import write_parts; write_parts(20000, 2, '/tmp/p20k')"
    mpirun -np 2 python -m bench.tree_epoch --parts /tmp/p20k --model sage
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import machine_name, median, setup_threads, tests_module


def write_parts(nodes: int, ranks: int, out: str) -> None:
    """Partition the benchmark's SBM graph of ``nodes`` nodes into ``ranks`` blocks parts."""
    from fullgraph.partition import partition_graph

    graph = tests_module("conftest").build_sbm_graph(
        num_nodes=nodes, num_features=128, avg_degree=10
    )
    partition_graph(graph, ranks, out, method="metis", seed=0, force=True)


def bench_part(nodes: int | None, parts: Path | None) -> tuple[Any, Any]:
    """``(part, communicator)``: one process on the whole SBM graph of ``nodes`` nodes (128
    features), or this rank's part of the partition ``parts`` under ``mpirun`` (mpi)."""
    if nodes is not None:
        from fullgraph.distributed.communicator import Communicator
        from fullgraph.partition import whole_graph_part

        graph = tests_module("conftest").build_sbm_graph(
            num_nodes=nodes, num_features=128, avg_degree=10
        )
        return whole_graph_part(graph), Communicator()
    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.launch import detect_launch
    from fullgraph.partition import load_partition

    comm = create_communicator("mpi", detect_launch(), timeout_s=120)
    return load_partition(parts, comm.rank), comm


def main(argv: list[str] | None = None) -> int:
    """Print the median step with and without the tree, and their ratio (rank 0)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--nodes", type=int, help="one process on an SBM graph of N nodes")
    source.add_argument("--parts", type=Path, help="a blocks partition, one part per rank")
    parser.add_argument("--model", default="gcn")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    import time

    from fullgraph.training import RunOptions, TrainConfig, Trainer

    part, comm = bench_part(args.nodes, args.parts)
    if getattr(part, "num_blocks", None) is None:
        raise SystemExit("tree_epoch: the part has no fixed node blocks (an old partition?)")
    cfg = TrainConfig(model=args.model, layers=2, hidden=128, dropout=0.5, epochs=100, seed=3)
    trainers = {k: Trainer(part, comm, cfg, RunOptions(quiet=True)) for k in ("tree", "today")}
    trainers["today"].ctx.blocks = None
    times: dict[str, list[float]] = {k: [] for k in trainers}
    for epoch in range(1, args.steps + 2):
        for name, trainer in trainers.items():
            if comm.size > 1:
                comm.barrier()
            t0 = time.perf_counter()
            trainer.train_step(epoch, keep_logits=False)
            if epoch > 1:
                times[name].append(time.perf_counter() - t0)
    tree, today = median(times["tree"]), median(times["today"])
    if comm.rank == 0:
        print(
            f"{machine_name()}: P={comm.size} {args.model} 2x128, {part.num_inner} rows on rank 0,"
            f" {part.num_blocks} blocks: tree {tree * 1e3:.1f} ms, today {today * 1e3:.1f} ms,"
            f" ratio {tree / today:.3f}"
        )
    if comm.size > 1:
        comm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
