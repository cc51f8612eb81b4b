"""Benchmark of the aggregation kernel ``spmm`` against its peers and two machine bounds.

Peers, same run, same graph, same X: ours (numba), FBGEMM (``F.embedding_bag``),
``torch.sparse.mm`` (CSR), PyG ``utils.spmm`` and ``GCNConv``-style propagation (gather, then
scatter), scipy; torch_scatter when installed. Forward and forward+backward at F = 16, 64, 128,
256. Bounds: the streaming roofline (byte model: CSR read once, every row of X read once, Y
written once, at the measured STREAM-triad bandwidth) and the gather bound (nnz divided by the
measured rate of uniformly random row gather-reduce at the same F). On the real graph it also
measures int64 indices, bf16 features, and node orders (RCM, random) for our kernel.

On CUDA the peers are ours (Triton) and cuSPARSE (``torch.sparse.mm`` on CSR; for
forward+backward also with the transpose built once, "cached", as ours keeps it), and the bound
is the HBM bandwidth (``--hbm-bw``; the device-to-device copy rate is measured beside it). Every
run writes, per graph and F, ours' ``speedup_vs_sparse_mm`` (the best ``torch.sparse.mm``
variant's time over ours) and ``fraction_of_memory_bandwidth`` (the byte model below over ours'
time, over HBM on CUDA or STREAM triad on the CPU), forward and forward+backward.

Timing: providers run interleaved, round by round, and the minimum over rounds is compared
(the machine is shared; ratios are taken within one run). Output buffers: every provider
allocates its own output; glibc is told (``MALLOC_*`` variables, set by re-executing this
module) to keep freed memory, so no provider pays fresh page faults after warm-up.

    python -m bench.kernels                      # CPU, both graphs, writes bench/results/
    python -m bench.kernels --device cuda --graphs arxiv --features 128
    python -m bench.kernels --device cuda --graphs parts/products-1   # a one-part partition
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from bench.child import bench_command, child_env
from bench.common import CSVWriter
from fullgraph.kernels import CSRMatrix, spmm
from fullgraph.kernels.spmm import SpmmFunction
from fullgraph.kernels.spmm_cpu import DEFAULT_CPU_IMPL, spmm_embedding_bag, spmm_numba

MALLOC_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",  # idle OpenMP threads sleep: CPU time then counts work only
    "MALLOC_MMAP_THRESHOLD_": str(1 << 32),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 36),
    "MALLOC_TOP_PAD_": str(1 << 28),
}
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def load_graph(which: str, data_root: Path) -> tuple[str, np.ndarray, np.ndarray]:
    """(name, indptr, indices) of a synthetic preset, a one-part partition or a real graph.

    ``which`` is one of:

    - a synthetic preset (``tiny``, ``arxiv``, ``products``, ...): read from ``data_root`` when
      ``fullgraph data synth --name <preset>-synth`` wrote it there, else generated in memory
      (same seed, same graph);
    - a partition directory of one part (``meta.json``, ``part-0/``): its local CSR, which is the
      whole graph (``python -m bench.gpu_check_commands make-parts`` writes one, no text layout);
    - a dataset name in ../shared/datasets, read in place (the loaders never write beside the
      data they read).
    """
    from fullgraph.datasets import load
    from fullgraph.datasets.synthetic import PRESETS, generate

    if which in PRESETS:
        name = f"{which}-synth"
        if (data_root / name.replace("-", "_")).is_dir():
            g = load(name, data_root)
        else:
            print(f"{name} not found under {data_root}; generating it in memory (seed 0)")
            g = generate(which, seed=0)
        return name, g.indptr, g.indices
    if (Path(which) / "meta.json").is_file():
        from fullgraph.partition import load_partition

        part = load_partition(which, 0, mmap=True, verify_checksums=False)
        if part.num_parts != 1:
            raise SystemExit(f"{which}: {part.num_parts} parts; give a one-part partition")
        return str(part.meta["dataset"]), np.asarray(part.indptr), np.asarray(part.indices)
    g = load(which, SHARED)
    return which, g.indptr, g.indices


def gcn_matrix(indptr: np.ndarray, indices: np.ndarray) -> CSRMatrix:
    """GCN-normalised matrix with self loops, int32 indices."""
    A = CSRMatrix(indptr, indices.astype(np.int32)).with_self_loops()
    deg = A.row_nnz().double()
    return A.gcn_normalized(deg, deg)


def permuted(A: CSRMatrix, perm: np.ndarray) -> CSRMatrix:
    """``P A P^T`` for new order ``perm`` (new node i is old node perm[i])."""
    M = A.to_scipy()[perm][:, perm].tocsr()
    M.sort_indices()
    return CSRMatrix(M.indptr, M.indices.astype(np.int32), M.data, num_cols=A.num_cols)


def stream_bandwidth(threads: int) -> float:
    """STREAM-triad bandwidth in bytes/s (a = b + s*c on 3 x 64 MB, 3 arrays counted)."""
    n = 16 << 20
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=1.5, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * 4 * n / best


def gather_rate(
    num_cols: int, nf: int, nnz: int, bag: int = 16, rounds: int = 5
) -> tuple[float, float]:
    """Uniformly random row gather-reduce rate at width ``nf``, best of numba and FBGEMM.

    Returns:
        (rows per wall second, rows per process CPU second).
    """
    rng = np.random.default_rng(1)
    m = nnz // bag
    idx = rng.integers(0, num_cols, m * bag).astype(np.int32)
    R = CSRMatrix(np.arange(0, m * bag + 1, bag, dtype=np.int64), idx, num_cols=num_cols)
    X = torch.rand(num_cols, nf)
    best, best_cpu = float("inf"), float("inf")
    for _ in range(rounds):
        for fn in (spmm_numba, spmm_embedding_bag):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(R, X)
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
    return m * bag / best, m * bag / max(best_cpu, 1e-9)


def streaming_bytes(A: CSRMatrix, nf: int, feat_bytes: int = 4, index_bytes: int = 4) -> int:
    """Byte model: CSR once (indptr 8 B/row, index + weight per nnz), X once, Y once."""
    csr = 8 * (A.num_rows + 1) + (index_bytes + 4) * A.nnz
    return csr + feat_bytes * nf * (A.num_cols + A.num_rows)


def sparse_csr(A: CSRMatrix) -> torch.Tensor:
    """``A`` as a torch CSR tensor with its own index dtype (int32: what cuSPARSE is fastest on)."""
    with warnings.catch_warnings():  # torch's "sparse CSR support is in beta" notice
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support.*")
        return torch.sparse_csr_tensor(
            A.indptr.to(A.indices.dtype), A.indices, A.values, size=A.shape, check_invariants=False
        )


class CachedSparseMM(torch.autograd.Function):
    """``torch.sparse.mm(S, X)`` whose backward uses a transpose built once (``St``).

    torch's own autograd of ``torch.sparse.mm`` transposes ``S`` on every backward call; ours
    keeps the transpose, so the like-for-like forward+backward peer keeps it too.
    """

    @staticmethod
    def forward(ctx, X: torch.Tensor, S: torch.Tensor, St: torch.Tensor) -> torch.Tensor:
        ctx.St = St
        return torch.sparse.mm(S, X)

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        return torch.sparse.mm(ctx.St, G.contiguous()), None, None


#: The ``torch.sparse.mm`` providers ours is compared with (cuSPARSE on CUDA).
SPARSE_MM = ("torch.sparse.mm", "torch.sparse.mm-cached")


def peers(A: CSRMatrix, device: torch.device) -> dict:
    """Providers: name -> fn(X) -> Y (``torch.sparse.mm-cached`` is timed in fwd+bwd only)."""
    S, St = sparse_csr(A), sparse_csr(A.t())
    out = {
        "ours": lambda X: spmm(A, X),
        "torch.sparse.mm": lambda X: torch.sparse.mm(S, X),
        "torch.sparse.mm-cached": lambda X: CachedSparseMM.apply(X, S, St),
    }
    if device.type == "cuda":
        return out
    from torch_geometric.nn import MessagePassing
    from torch_geometric.utils import spmm as pyg_spmm

    class Propagate(MessagePassing):  # GCNConv's aggregation: gather x_j, scale, scatter-add
        def __init__(self) -> None:
            super().__init__(aggr="add")

        def forward(self, x, edge_index, w):
            return self.propagate(edge_index, x=x, w=w)

        def message(self, x_j, w):
            return x_j * w.view(-1, 1)

    edge_index = torch.stack([A.indices.long(), A.row_of_entry()])
    prop = Propagate()
    sc = A.to_scipy()
    out.update(
        {
            "ours-numba": lambda X: SpmmFunction.apply(X, A, "cpu-numba", None),
            "ours-embedding_bag": lambda X: SpmmFunction.apply(X, A, "cpu-embedding_bag", None),
            "fbgemm-embedding_bag": lambda X: spmm_embedding_bag(A, X),
            "pyg-spmm": lambda X: pyg_spmm(S, X, reduce="sum"),
            "pyg-gcnconv-propagate": lambda X: prop(X, edge_index, A.values),
            "scipy": lambda X: torch.from_numpy(sc @ X.detach().numpy()),
        }
    )
    return out


def time_rounds(
    fns: dict, rounds: int, sync, inner: int = 1, budget_s: float = 3.0, max_rounds: int = 40
) -> dict:
    """Interleaved timing; returns name -> [(wall seconds, process CPU seconds) per call].

    Every round runs every provider ``inner`` times (then waits for the device), in a shuffled
    order (cache state left by the previous provider differs). A provider runs
    at least ``rounds`` rounds and keeps going (up to ``max_rounds``) while it has spent less
    than ``budget_s``: on a shared machine the minimum of many short samples is the figure that
    other processes disturb least. Process CPU time (all threads; OpenMP told to sleep, not
    spin, when idle) is recorded too: it is what other processes disturb least of all.

    A provider whose warm-up call raises (a peer that lacks this device or dtype) is left out
    with one line, so the others are still measured.
    """
    fns = dict(fns)
    for k, fn in list(fns.items()):
        try:
            fn()
        except Exception as exc:  # a peer's gap must not lose the other providers' figures
            print(f"  {k}: left out, it raised {type(exc).__name__}: {exc}".splitlines()[0])
            del fns[k]
    sync()
    times = {k: [] for k in fns}
    order = np.random.default_rng(0)
    for r in range(max_rounds):
        active = [k for k in fns if r < rounds or sum(w for w, _ in times[k]) * inner < budget_s]
        if not active:
            break
        for k in order.permutation(active):  # no provider always follows the same one
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(inner):
                fns[k]()
            sync()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            times[k].append((wall / inner, cpu / inner))
    return times


class Best(dict):
    """Provider -> best seconds; a provider left out (it raised) reads as NaN."""

    def __missing__(self, key: str) -> float:
        return float("nan")

    def best_of(self, names: tuple[str, ...]) -> float:
        """The fastest of ``names`` measured (NaN when none was)."""
        return min([self[k] for k in names if k in self] or [float("nan")])


def fwd_bwd(fn, X: torch.Tensor, G: torch.Tensor):
    """A closure running forward and backward of provider ``fn``."""

    def run():
        Xg = X.detach().requires_grad_(True)
        fn(Xg).backward(G)

    return run


def bench_graph(name, A, args, device, csv, stream_bw, summary) -> None:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    inner = 10 if device.type == "cuda" else 1
    A.t()  # the transpose is built once per graph (before the move: it moves along), not per call
    A = A.to(device)
    fns = peers(A, device)
    bound = "HBM" if device.type == "cuda" else "STREAM"
    print(f"\n{name}: {A.num_rows:,} rows, {A.nnz:,} non-zeros, device {device}")
    for nf in args.features:
        X = torch.randn(A.num_cols, nf, device=device)
        G = torch.randn(A.num_rows, nf, device=device)
        fwd = {k: (lambda f=f, X=X: f(X)) for k, f in fns.items() if k != "torch.sparse.mm-cached"}
        res = {"fwd": time_rounds(fwd, args.rounds, sync, inner, args.budget)}
        bwd = {k: fwd_bwd(f, X, G) for k, f in fns.items() if k != "scipy"}
        if device.type == "cpu":
            bwd["fbgemm-embedding_bag"] = fwd_bwd(
                lambda Xg: torch.nn.functional.embedding_bag(
                    A.indices,
                    Xg,
                    A.indptr.int(),
                    mode="sum",
                    per_sample_weights=A.values,
                    include_last_offset=True,
                ),
                X,
                G,
            )
        res["fwdbwd"] = time_rounds(bwd, args.rounds, sync, inner, args.budget)
        bytes_ = streaming_bytes(A, nf)
        moved = {"fwd": bytes_, "fwdbwd": bytes_ + streaming_bytes(A.t(), nf)}
        for mode, times in res.items():
            for k, ts in times.items():
                walls = [w for w, _ in ts]
                csv.write(f"spmm-{name}-{mode}", k, "time", "ms", nf, 1e3 * min(walls))
                csv.write(f"spmm-{name}-{mode}", k, "time_median", "ms", nf, 1e3 * np.median(walls))
                cpu = min(c for _, c in ts)
                csv.write(f"spmm-{name}-{mode}", k, "cpu_time", "ms", nf, 1e3 * cpu)
        best = {m: Best({k: min(w for w, _ in ts) for k, ts in t.items()}) for m, t in res.items()}
        best_cpu = {
            m: Best({k: min(c for _, c in ts) for k, ts in t.items()}) for m, t in res.items()
        }
        for mode, b in best.items():  # the figures bench.gpu_check reads
            sparse = b.best_of(SPARSE_MM)
            csv.write(
                f"spmm-{name}-{mode}", "ours", "speedup_vs_sparse_mm", "x", nf, sparse / b["ours"]
            )
            for k in ("ours", *SPARSE_MM):
                if k in b:
                    frac = moved[mode] / b[k] / stream_bw
                    what = f"spmm-{name}-{mode}"
                    csv.write(what, k, "fraction_of_memory_bandwidth", "1", nf, frac)
        roof = bytes_ / stream_bw
        csv.write(f"spmm-{name}-fwd", "streaming-roofline", "time", "ms", nf, 1e3 * roof)
        line = f"  F={nf:4d} fwd ms: " + ", ".join(
            f"{k} {1e3 * v:.1f}" for k, v in best["fwd"].items()
        )
        if device.type == "cpu":
            rate, rate_cpu = gather_rate(A.num_cols, nf, A.nnz, rounds=2 * args.rounds)
            gbound, gbound_cpu = A.nnz / rate, A.nnz / rate_cpu
            csv.write(f"spmm-{name}-fwd", "gather-bound", "time", "ms", nf, 1e3 * gbound)
            csv.write(f"spmm-{name}-fwd", "gather-bound", "cpu_time", "ms", nf, 1e3 * gbound_cpu)
            line += f" | roofline {1e3 * roof:.1f}, gather bound {1e3 * gbound:.1f}"
        else:
            for mode in ("fwd", "fwdbwd"):
                bw = moved[mode] / best[mode]["ours"]
                line += f" | {mode} ours {bw / 1e9:.0f} GB/s = {bw / stream_bw:.0%} of {bound}"
        print(line)
        print(
            "          fwd+bwd ms: "
            + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in best["fwdbwd"].items())
        )
        print(
            "          fwd CPU ms: "
            + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in best_cpu["fwd"].items())
            + (f" | gather bound {1e3 * gbound_cpu:.1f}" if device.type == "cpu" else "")
        )
        print(
            "      fwd+bwd CPU ms: "
            + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in best_cpu["fwdbwd"].items())
        )
        summary[(name, nf)] = (best, roof, gbound if device.type == "cpu" else None, moved)
        if device.type == "cpu":
            summary[(name + " [CPU time]", nf)] = (
                best_cpu,
                roof * args.threads,
                gbound_cpu,
                {m: v * args.threads for m, v in moved.items()},
            )


def bench_variants(name, A, args, csv, stream_bw) -> None:
    """Ours with int64 indices, bf16 features, RCM and random node orders (same run)."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    rcm = reverse_cuthill_mckee(A.to_scipy().tocsr(), symmetric_mode=True).astype(np.int64)
    rnd = np.random.default_rng(0).permutation(A.num_rows)
    forms = {
        "int32": (A, torch.float32),
        "int64": (A.with_indices(torch.int64), torch.float32),
        "bf16": (A, torch.bfloat16),
        "rcm-order": (permuted(A, rcm), torch.float32),
        "random-order": (permuted(A, rnd), torch.float32),
    }
    variants = {
        f"{impl}-{k}": (impl, M, dt)
        for impl in ("embedding_bag", "numba")
        for k, (M, dt) in forms.items()
    }
    print(f"  {name} variants of ours (forward):")
    for nf in args.features:
        X = torch.randn(A.num_cols, nf)
        inputs = {k: (f"cpu-{impl}", M, X.to(dt)) for k, (impl, M, dt) in variants.items()}
        fns = {
            k: (lambda b=b, M=M, Xd=Xd: SpmmFunction.apply(Xd, M, b, None))
            for k, (b, M, Xd) in inputs.items()
        }
        times = time_rounds(fns, args.rounds, lambda: None, 1, args.budget)
        parts = []
        for k, ts in times.items():
            _, M, dt = variants[k]
            wall, cpu = min(w for w, _ in ts), min(c for _, c in ts)
            feat_bytes = 2 if dt == torch.bfloat16 else 4
            index_bytes = 8 if M.indices.dtype == torch.int64 else 4
            roof = streaming_bytes(M, nf, feat_bytes, index_bytes) / stream_bw
            what = f"spmm-{name}-variants"
            csv.write(what, f"ours-{k}", "time", "ms", nf, 1e3 * wall)
            csv.write(what, f"ours-{k}", "cpu_time", "ms", nf, 1e3 * cpu)
            csv.write(what, f"ours-{k}", "fraction_of_stream_roofline", "1", nf, roof / wall)
            csv.write(
                what,
                f"ours-{k}",
                "cpu_fraction_of_stream_roofline",
                "1",
                nf,
                roof * args.threads / cpu,
            )
            parts.append(
                f"{k} {1e3 * wall:.1f} ms ({roof / wall:.0%}) cpu {1e3 * cpu:.1f} ms "
                f"({roof * args.threads / cpu:.0%})"
            )
        print(f"  F={nf:4d} [time (fraction of streaming roofline)] " + ", ".join(parts))


def report_targets(summary, device: torch.device, bandwidth: float) -> None:
    """Print the issue's targets at F=128 (every F on CUDA) against what was measured."""
    on_gpu = device.type == "cuda"
    where = "every F" if on_gpu else "F=128"
    print(f"\nTargets at {where} (min over rounds; [CPU time] rows compare process CPU seconds):")
    for (name, nf), (best, roof, gbound, moved) in summary.items():
        if nf != 128 and not on_gpu:
            continue
        f, b = best["fwd"], best["fwdbwd"]
        cached = b.best_of(SPARSE_MM)
        if on_gpu:
            msg = [
                f"fwd vs cuSPARSE {f['torch.sparse.mm'] / f['ours']:.2f}x (target >= 1.0)",
                f"fwd+bwd vs cached cuSPARSE {cached / b['ours']:.2f}x (>= 1.0)",
                f"fwd {moved['fwd'] / f['ours'] / bandwidth:.0%} of HBM (>= 70%)",
                f"fwd+bwd {moved['fwdbwd'] / b['ours'] / bandwidth:.0%} of HBM (>= 70%)",
            ]
            print(f"  {name} F={nf}: " + "; ".join(msg))
            continue
        r_sparse = f["torch.sparse.mm"] / f["ours"]
        msg = [f"fwd vs torch.sparse.mm {r_sparse:.2f}x (target >= 1.8)"]
        if "fbgemm-embedding_bag" in f:
            fb = f["fbgemm-embedding_bag"]
            msg.append(f"vs FBGEMM {fb / f['ours']:.2f}x (>= 0.95)")
            msg.append(f"numba kernel vs FBGEMM {fb / f['ours-numba']:.2f}x")
        if gbound is not None:
            msg.append(f"{gbound / f['ours']:.0%} of gather bound (>= 80%)")
        msg.append(f"{roof / f['ours']:.0%} of streaming roofline")
        msg.append(f"fwd+bwd vs torch.sparse.mm {b['torch.sparse.mm'] / b['ours']:.2f}x (>= 5)")
        msg.append(f"vs cached {cached / b['ours']:.2f}x")
        print(f"  {name}: " + "; ".join(msg))


def device_copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in bytes/s, bytes read plus written, best of 10 copies."""
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(11):  # the first is a warm-up
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--graphs",
        default="arxiv,coauthor-physics",
        help="comma list of: a synthetic preset (arxiv, products, tiny: read from --data-root "
        "or generated), a one-part partition directory, a dataset name in ../shared/datasets "
        "(default: arxiv,coauthor-physics)",
    )
    p.add_argument("--features", default="16,64,128,256", help="feature widths F")
    p.add_argument("--threads", type=int, default=2, help="torch/numba threads (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per provider")
    p.add_argument(
        "--budget",
        type=float,
        default=3.0,
        help="seconds per provider after which no extra rounds run (default 3)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run")
    p.add_argument(
        "--data-root",
        type=Path,
        default=Path("/tmp/fg-data"),
        help="root holding arxiv-synth (written by `fullgraph data synth`)",
    )
    p.add_argument("--hbm-bw", type=float, default=4.8e12, help="HBM bytes/s (H200: 4.8e12)")
    p.add_argument("--out", type=Path, default=Path("bench/results/kernels.csv"), help="CSV")
    p.add_argument("--no-variants", action="store_true", help="skip int64/bf16/order variants")
    args = p.parse_args(argv)
    args.features = [int(f) for f in args.features.split(",")]
    if args.device == "cpu" and any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        again = bench_command("kernels", *sys.argv[1:])
        os.execve(again[0], again, child_env(MALLOC_ENV))
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    csv = CSVWriter(args.out)
    if device.type == "cpu":
        stream_bw = stream_bandwidth(args.threads)
        print(f"STREAM triad: {stream_bw / 1e9:.1f} GB/s ({args.threads} threads)")
        print(f"ours = fullgraph.kernels.spmm; CPU implementation {DEFAULT_CPU_IMPL!r} by default")
        csv.write("machine", "stream-triad", "bandwidth", "GB/s", args.threads, stream_bw / 1e9)
    else:
        stream_bw = args.hbm_bw
        copy_bw = device_copy_bandwidth(device)
        print(
            f"{torch.cuda.get_device_name(device)}: HBM {stream_bw / 1e12:.2f} TB/s (--hbm-bw); "
            f"device-to-device copy measured {copy_bw / 1e12:.2f} TB/s (read + write)"
        )
        print("ours = fullgraph.kernels.spmm (Triton); torch.sparse.mm = cuSPARSE")
        csv.write("machine", "hbm", "bandwidth", "GB/s", 1, stream_bw / 1e9)
        csv.write("machine", "device-copy", "bandwidth", "GB/s", 1, copy_bw / 1e9)
    try:
        import torch_scatter  # noqa: F401

        print("torch_scatter installed but not measured here")
    except ImportError:
        print("torch_scatter: not installed (not measured)")
    summary: dict = {}
    for which in args.graphs.split(","):
        name, indptr, indices = load_graph(which, args.data_root)
        A = gcn_matrix(indptr, indices)
        bench_graph(name, A, args, device, csv, stream_bw, summary)
        if which != "arxiv" and device.type == "cpu" and not args.no_variants:
            bench_variants(name, A, args, csv, stream_bw)
    report_targets(summary, device, stream_bw)
    print(f"\nrows appended to {args.out}; plot: python -m bench.plot {args.out}")
    print("reproduce: " + csv.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
