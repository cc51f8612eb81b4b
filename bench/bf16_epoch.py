"""bf16-mixed's training step with the bfloat16 backward against float32, interleaved.

Three trainers on the same part, stepped in turn so the machine's load falls on all alike:
``32`` (float32, the block tree), ``bf16-mixed`` (the bfloat16 backward the tree allows) and
``bf16-mixed rank-order`` (``--sums rank-order``: bf16 forward, float32 backward, the path
before the tree). Reported: the median step of each and the speed-ups over float32. One process
on an SBM graph of the tests (``--nodes N``, 128 features) or ``--parts DIR`` under ``mpirun
-np P`` (rank r trains part r of a blocks partition: ``bench.tree_epoch.write_parts``).

Usage::

    python -m bench.bf16_epoch --nodes 30000 --model sage
    python -c "from bench.tree_epoch import write_parts; write_parts(60000, 2, '/tmp/p60k')"
    mpirun -np 2 python -m bench.bf16_epoch --parts /tmp/p60k --model gcn
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import machine_name, median, setup_threads
from bench.tree_epoch import bench_part

#: name -> (--precision, --sums)
VARIANTS = {
    "32": ("32", "tree"),
    "bf16-mixed": ("bf16-mixed", "tree"),
    "bf16-mixed rank-order": ("bf16-mixed", "rank-order"),
}


def main(argv: list[str] | None = None) -> int:
    """Print the median step of each variant and the speed-ups over float32 (rank 0)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--nodes", type=int, help="one process on an SBM graph of N nodes")
    source.add_argument("--parts", type=Path, help="a blocks partition, one part per rank")
    parser.add_argument("--model", default="gcn")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8, help="timed steps (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    import time

    from fullgraph.training import RunOptions, TrainConfig, Trainer

    part, comm = bench_part(args.nodes, args.parts)
    trainers = {}
    for name, (precision, sums) in VARIANTS.items():
        cfg = TrainConfig(
            model=args.model,
            layers=args.layers,
            hidden=args.hidden,
            dropout=0.5,
            epochs=100,
            seed=3,
            precision=precision,
            sums=sums,
        )
        trainers[name] = Trainer(part, comm, cfg, RunOptions(quiet=True))
    times: dict[str, list[float]] = {k: [] for k in trainers}
    for epoch in range(1, args.steps + 2):
        for name, trainer in trainers.items():
            if comm.size > 1:
                comm.barrier()
            t0 = time.perf_counter()
            trainer.train_step(epoch, keep_logits=False)
            if epoch > 1:
                times[name].append(time.perf_counter() - t0)
    med = {k: median(v) for k, v in times.items()}
    from fullgraph.precision import CPU_BF16_FLAGS, parse_cpu_flags

    with open("/proc/cpuinfo") as f:
        flags = sorted(parse_cpu_flags(f.read()) & set(CPU_BF16_FLAGS)) or ["no bf16 flags"]
    if comm.rank == 0:
        cells = ", ".join(f"{k} {v * 1e3:.1f} ms ({med['32'] / v:.2f}x)" for k, v in med.items())
        print(
            f"{machine_name()} [{' '.join(flags)}]: P={comm.size} {args.model} "
            f"{args.layers}x{args.hidden}, {part.num_inner} rows on rank 0: {cells}"
        )
    if comm.size > 1:
        comm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
