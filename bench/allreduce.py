"""Benchmark of the gradient all-reduce: the transport's native sum against the fixed-order sum.

The vector is what a training step all-reduces for a 3-layer GCN with hidden 256 on a graph with
100 input features and 40 classes: every parameter of :class:`fullgraph.models.GNN` plus the
loss (float32). For each P one ``mpirun -n P`` launch times, over each transport, ``--calls``
calls of

- ``native``: the transport's own reduction (``Communicator._allreduce``: ``Iallreduce`` for
  mpi, ``all_reduce`` for gloo / nccl), i.e. what ``allreduce_`` did before the fixed order;
- ``ordered``: ``Communicator.allreduce_`` (all-to-all reduce-scatter, rank-order sum,
  all-to-all all-gather);

interleaved call by call, every call after a barrier and from the same input. A call's time is
the slowest rank's; the table gives the median over the calls, and whether the first result is
the same bit for bit over the transports.

Usage: ``python -m bench.allreduce [--ranks 2,4] [--transports mpi,gloo] [--calls 200]
[--out bench/results]``. Appends long-format rows to ``OUT/allreduce.csv`` (bench/common.py)
and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.child import bench_command, child_env, run_checked
from bench.common import CSVWriter

BIN = Path(sys.executable).parent
#: The model whose gradients are reduced: GCN, in 100, hidden 256, out 40, 3 layers.
MODEL = ("gcn", 100, 256, 40, 3)
METHODS = ("native", "ordered")


def gradient_length() -> int:
    """Elements of the reduced vector: the parameters of :data:`MODEL` plus the loss."""
    from fullgraph.models.gnn import GNN

    kind, fin, hidden, fout, layers = MODEL
    model = GNN(kind, fin, hidden, fout, layers, 0.5, 0.5)
    return sum(p.numel() for p in model.parameters()) + 1


# -- worker: one rank of the mpirun launch ----------------------------------------------------
def worker(a: argparse.Namespace) -> None:
    """Time both methods on every transport; rank 0 writes the results as JSON."""
    import numpy as np
    import torch

    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.launch import detect_launch
    from fullgraph.kernels.cpu_launch import set_threads

    set_threads(1)
    info = detect_launch()
    n = gradient_length()
    rng = np.random.default_rng(info.rank)
    source = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 1e-3)
    result: dict = {"n": n, "ranks": info.size, "times": {}, "digest": {}}
    for transport in a.transports.split(","):
        comm = create_communicator(transport, info, timeout_s=120)
        buf = source.clone()
        calls = {
            "native": lambda c=comm, b=buf: c._allreduce(b, "sum"),
            "ordered": lambda c=comm, b=buf: c.allreduce_(b, "sum", tag="bench"),
        }
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for i in range(a.warmup + a.calls):
            for method in METHODS:
                buf.copy_(source)
                comm.barrier()
                t0 = time.perf_counter()
                calls[method]()
                dt = time.perf_counter() - t0
                if i == 0:
                    digest = hashlib.sha256(buf.numpy().tobytes()).hexdigest()
                    result["digest"][f"{transport}/{method}"] = digest
                if i >= a.warmup:
                    times[method].append(dt)
        per_rank = comm.allgather_object(times)
        for method in METHODS:
            slowest = [max(r[method][i] for r in per_rank) for i in range(a.calls)]
            result["times"][f"{transport}/{method}"] = slowest
        comm.close()
    if info.rank == 0:
        Path(a.json).write_text(json.dumps(result))


# -- driver -----------------------------------------------------------------------------------
def run_ranks(ranks: int, a: argparse.Namespace) -> dict:
    """One ``mpirun -n ranks`` launch of :func:`worker`; its results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(BIN / "mpirun"), "-n", str(ranks), *bench_command("allreduce", "--worker")]
        cmd += ["--transports", a.transports, "--calls", str(a.calls), "--warmup", str(a.warmup)]
        cmd += ["--json", str(out)]
        run_checked(cmd, env=child_env({"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}))
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    """Parse the options; run the worker (``--worker``) or the launches, table and CSV."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--transports", default="mpi,gloo")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    csv = CSVWriter(Path(a.out) / "allreduce.csv")
    transports = a.transports.split(",")
    head = ("P", "transport", "floats", "native ms", "ordered ms", "ratio")
    print("{:>2} {:>9} {:>8} {:>10} {:>11} {:>6}".format(*head))
    for ranks in (int(r) for r in a.ranks.split(",")):
        res = run_ranks(ranks, a)
        for transport in transports:
            med = {m: statistics.median(res["times"][f"{transport}/{m}"]) for m in METHODS}
            for m in METHODS:
                csv.write("allreduce", f"{transport}/{m}", "median_s", "s", res["n"], med[m], ranks)
            print(
                f"{ranks:>2} {transport:>9} {res['n']:>8} {med['native'] * 1e3:>10.3f} "
                f"{med['ordered'] * 1e3:>11.3f} {med['ordered'] / med['native']:>6.2f}"
            )
        for m in METHODS:
            same = len({res["digest"][f"{t}/{m}"] for t in transports}) == 1
            print(f"   P={ranks} {m}: same bits over {', '.join(transports)}: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
