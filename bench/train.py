"""Benchmark of the full-batch trainer on an arxiv-like synthetic graph (3-layer GCN, hidden 256).

Measures in one run, each configuration in its own process (``mpirun`` for ours):

(a) our one-process epoch against PyG (``GCNConv(cached=True)`` on a CSR adjacency), same graph,
    model (dropout 0.5 between layers, none on the input) and threads;
(b) P = 2 ranks with one thread each against P = 1 with one thread;
(c) the ``mpi`` transport's halo exchange time against ``gloo`` for the same bytes;
(d) measured halo bytes per training step against the formula
    ``4 B x total halo rows x sum over exchanges of their width`` (forward: every layer not
    precomputed, width min(in, out) as the layer transforms first when out <= in; backward: every
    layer after the first);
(e) peak memory per rank at P = 4 against the one-process peak, as measured (RSS) and net of
    the runtime floor: the peak of the same runs on a 3,000-node graph, i.e. what a process
    holds whatever the graph (Python, torch, numba, MPI, the model);
(f) the share of epoch time in communication, and what the overlap hides (same run with
    ``overlap=False``).

(g) ``--case computers`` (or ``all``): one process against 2 ranks on Amazon Computers with the
    real ``fullgraph train`` command, GCN / GraphSAGE / GAT (:mod:`bench.train_computers`).

Usage: ``python -m bench.train [--case arxiv|computers|all] [--epochs 5] [--scale-check 3]
[--out bench/results]``. Writes ``OUT/train.csv`` (long format, bench/common.py) and
``OUT/train.png``; the computers case ``OUT/train_computers.csv``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

from bench import pyg_baseline, train_computers
from bench.child import bench_command, child_env, emit_result, run_child
from bench.common import setup_threads
from bench.train_report import report

ROOT = Path(__file__).resolve().parents[1]
#: The graph whose runs measure the memory floor of a rank: the process, torch, numba and MPI
#: with (almost) no graph, the same model and steps.
FLOOR_DATASET = "tiny-synth"


# -- workers (run in their own processes) -------------------------------------------------------
def worker_ours(a: argparse.Namespace) -> None:
    """Time our train step (and the bare exchange) on this rank; rank 0 prints the result."""
    import torch

    from fullgraph.distributed import create_communicator
    from fullgraph.distributed.launch import detect_launch
    from fullgraph.resources import current_rss_mb, peak_rss_mb
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    setup_threads(a.threads)
    comm = create_communicator(a.transport, detect_launch(), timeout_s=600)
    base_rss = current_rss_mb()
    if a.parts:
        from fullgraph.partition import load_partition

        part = load_partition(a.parts, comm.rank, mmap=False)
    else:
        from fullgraph.datasets.registry import load
        from fullgraph.partition import whole_graph_part

        part = whole_graph_part(load(a.dataset, a.root))
    cfg = TrainConfig(
        model="gcn",
        layers=3,
        hidden=256,
        dropout=0.5,
        input_dropout=0.0,
        precompute_first=a.precompute,
        exchange_buffer_mb=a.exchange_buffer_mb,
    )
    tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
    for plan in tr.ctx.plans():
        plan.overlap = not a.no_overlap
    steps = []
    for epoch in range(1, a.warmup + a.epochs + 1):
        halo0 = comm.bytes_sent["halo"]
        step = tr.train_step(epoch)
        if epoch > a.warmup:
            steps.append(
                [step.seconds, step.comm_s, step.reduce_s, comm.bytes_sent["halo"] - halo0]
            )
    h = torch.randn(part.num_inner, 256)
    ex = []
    for i in range(13):
        comm.barrier()
        t0 = time.perf_counter()
        tr.ctx.plan.start_forward(h).wait()
        if i >= 3:
            ex.append(time.perf_counter() - t0)
    local = torch.tensor(
        [
            statistics.median(s[0] for s in steps),
            statistics.median(s[1] for s in steps),
            statistics.median(s[2] for s in steps),
            statistics.median(ex),
            peak_rss_mb(),
            base_rss,
        ],
        dtype=torch.float64,
    )
    maxes = comm.allreduce_(local, "max", tag="bench").tolist()
    sums = comm.allreduce_(
        torch.tensor([steps[-1][3], part.num_halo], dtype=torch.float64), "sum", tag="bench"
    ).tolist()
    if comm.rank == 0:
        keys = ["step_s", "comm_s", "reduce_s", "exchange_s", "peak_rss_mb", "base_rss_mb"]
        res = dict(zip(keys, maxes, strict=True))
        res.update(
            halo_bytes=sums[0],
            halo_rows=sums[1],
            ranks=comm.size,
            dims=tr.model.dims,
            precomputed=tr.ctx.first_aggregate is not None,
        )
        emit_result(res)
    comm.close()


def worker_pyg(a: argparse.Namespace) -> None:
    """Time PyG's GCN (cached normalisation, CSR adjacency) on the same graph; print the result."""
    build = partial(pyg_baseline.gcn_layers, hidden=256, layers=3)
    res = pyg_baseline.measure(
        a.dataset,
        a.root,
        a.threads,
        build,
        adjacency="csr",
        dropout=0.5,
        input_dropout=0.0,
        warmup=a.warmup,
        epochs=a.epochs,
    )
    emit_result({**res, "ranks": 1})


# -- orchestration ---------------------------------------------------------------------------
def _ensure_data(root: str, dataset: str, preset: str, out: str, scale: int = 1) -> dict[int, Path]:
    """Generate ``dataset`` (synthetic ``preset``, ``scale`` times its nodes and edges) under
    ``root`` if missing; partition it into 2 and 4 parts under ``out/parts``; return the
    partition directories."""
    from fullgraph.datasets.registry import load
    from fullgraph.partition import partition_graph

    if not (Path(root) / dataset.replace("-", "_")).is_dir():
        from fullgraph.datasets.synthetic import PRESETS, generate, write_ogb

        cfg = PRESETS[preset]
        sizes = {"num_nodes": cfg.num_nodes * scale, "num_edges": cfg.num_edges * scale}
        write_ogb(generate(preset, seed=0, **sizes), root, dataset)
    graph = load(dataset, root)  # parses the raw files once, so workers read the .npy cache
    parts = {}
    for p in (2, 4):
        parts[p] = Path(out) / "parts" / f"{dataset}-{p}"
        if not (parts[p] / "meta.json").is_file():
            partition_graph(graph, p, parts[p], method="metis", seed=0, force=True)
    return parts


def predicted_halo_bytes(dims: list[int], halo_rows: float, precomputed: bool) -> float:
    """Formula (d): bytes of the halo exchanges of one training step (forward + backward)."""
    widths = 0
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        w = d_out if d_out <= d_in else d_in
        if not (i == 0 and precomputed):
            widths += w  # forward
        if i > 0:
            widths += w  # backward: the layer's input needs a gradient
    return 4.0 * halo_rows * widths


def main() -> None:
    """Run every configuration, print the figures against their targets, write CSV and PNG."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=("ours", "pyg"))
    ap.add_argument("--root", default="/tmp/fg-data", help="dataset root")
    ap.add_argument("--dataset", default="arxiv-synth", help="dataset name under --root")
    ap.add_argument("--preset", default="arxiv", help="synthetic preset when the data is missing")
    ap.add_argument("--parts", help="(worker) partition directory")
    ap.add_argument("--transport", default="local")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precompute", default="auto")
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--exchange-buffer-mb", type=float, default=256.0, help="(worker)")
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs per configuration")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--scale-check",
        type=int,
        default=3,
        help="also measure (e) on a graph this many times larger (0: skip; default 3)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--case", choices=("arxiv", "computers", "all"), default="arxiv")
    train_computers.add_arguments(ap)
    a = ap.parse_args()
    if a.worker == "ours":
        return worker_ours(a)
    if a.worker == "pyg":
        return worker_pyg(a)
    if a.case in ("computers", "all"):
        train_computers.report(a, train_computers.run_case(a))
        if a.case == "computers":
            return None
    parts = _ensure_data(a.root, a.dataset, a.preset, a.out)
    floor_parts = _ensure_data(a.root, FLOOR_DATASET, "tiny", a.out)
    py = bench_command("train")
    mpirun = str(Path(sys.executable).parent / "mpirun")
    common = [
        "--root",
        a.root,
        "--dataset",
        a.dataset,
        "--epochs",
        str(a.epochs),
        "--warmup",
        str(a.warmup),
    ]
    # The environment `fullgraph train` sets, given to PyG's worker too (same allocator).
    env = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"}
    run = partial(run_child, env=child_env(env), echo=True)
    runs: dict[str, dict] = {}
    print("(a) one process, ours vs PyG, 1 thread", flush=True)
    runs["pyg"] = run([*py, "--worker", "pyg", *common])
    runs["p1"] = run([*py, "--worker", "ours", *common])
    runs["p1_noprecompute"] = run([*py, "--worker", "ours", "--precompute", "off", *common])
    print("(b, c, f) 2 ranks, 1 thread each: mpi, gloo, mpi without overlap", flush=True)
    for name, extra in (
        ("p2_mpi", ["--transport", "mpi"]),
        ("p2_gloo", ["--transport", "gloo"]),
        ("p2_mpi_nooverlap", ["--transport", "mpi", "--no-overlap"]),
    ):
        runs[name] = run(
            [mpirun, "-n", "2", *py, "--worker", "ours", "--parts", str(parts[2]), *extra, *common]
        )
    print("(e) 4 ranks", flush=True)
    runs["p4_mpi"] = run(
        [
            mpirun,
            "-n",
            "4",
            *py,
            "--worker",
            "ours",
            "--parts",
            str(parts[4]),
            "--transport",
            "mpi",
            *common,
        ]
    )
    print("(e) runtime floor: the same runs on the tiny graph (3,000 nodes)", flush=True)
    floor = [*py, "--worker", "ours", "--root", a.root, "--dataset", FLOOR_DATASET]
    floor += ["--epochs", "2", "--warmup", "1"]
    runs["floor_p1"] = run(floor)
    floor += ["--parts", str(floor_parts[4]), "--transport", "mpi"]
    runs["floor_p4_mpi"] = run([mpirun, "-n", "4", *floor])
    if a.scale_check > 1:
        big = f"{a.dataset}-x{a.scale_check}"
        print(f"(e) at scale: {big}, {a.scale_check}x the nodes and edges", flush=True)
        big_parts = _ensure_data(a.root, big, a.preset, a.out, a.scale_check)
        big_common = [*common[:2], "--dataset", big, "--epochs", "2", "--warmup", "1"]
        runs["scaled_p1"] = run([*py, "--worker", "ours", *big_common])
        big_common += ["--parts", str(big_parts[4]), "--transport", "mpi"]
        p4 = [mpirun, "-n", "4", *py, "--worker", "ours", *big_common]
        runs["scaled_p4_mpi"] = run(p4)
        runs["scaled_p4_mpi_sliced"] = run([*p4, "--exchange-buffer-mb", "16"])
    report(runs, a, predicted_halo_bytes)


if __name__ == "__main__":
    main()
