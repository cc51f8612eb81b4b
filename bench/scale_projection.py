"""papers100M on paper: per-rank memory and epoch time at P = 16, 64, 128 from the memory model.

Memory: :func:`fullgraph.memory.model.predict` on a partition *described* rather than
computed (every part alike): ogbn-papers100M, 111,059,956 nodes, 1,615,685,872 citation edges
stored in both directions (3.23 B in-edges, as the OGB and SAR examples symmetrise it), 128
features, 172 classes, 1.1% training nodes (1,207,179), GraphSAGE 3 x 256, dropout 0.5, the
default exchange buffer. The halo is an assumption, stated by ``--halo-ratio`` and
``--halo-growth``: a part of ``n = N/P`` rows receives ``h = min(rho(P) n, N - n)`` halo rows
(and sends as many) with ``rho(P) = rho_16 (P / 16) ^ gamma``; halo edges ``1.7 h`` (what the
METIS parts of our synthetic graphs hold, 1.6-1.8 per halo row). The process floor is measured
here (:func:`~fullgraph.memory.model.measure_floor`).

Epoch time: a cost model with rates measured on this machine, one thread: ``spmm`` (stored
entries x columns per second, :func:`fullgraph.kernels.spmm` on a products-like CSR) and
``torch.mm`` (flop/s); an epoch does, per rank, the aggregations ``e (F + H + C)`` forward and
``e (H + C)`` backward (the first layer aggregates first and needs no input gradient), the dense
products ``2 n d o`` (twice per SAGE layer forward, four times backward, two for the first
layer's weight gradients), and moves ``4 (S (F + H + C) + h (H + C))`` halo bytes at
``--bandwidth`` GB/s.

Usage: ``python -m bench.scale_projection [--halo-ratio 1.0 --halo-growth 0.5]``; prints one
line per P and writes ``OUT/scale_projection.csv``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import CSVWriter

ROOT = Path(__file__).resolve().parents[1]

NODES = 111_059_956
EDGES = 1_615_685_872
FEATURES, CLASSES, HIDDEN, LAYERS = 128, 172, 256, 3
TRAIN = 1_207_179
#: SAR (Mostafa, MLSys 2022), papers100M, GraphSAGE: measured memory per machine (GB).
SAR_GB = {32: 95, 64: 47, 128: 25}


def shape(parts: int, rho16: float, growth: float):
    """The described partition of papers100M into ``parts`` equal parts."""
    from fullgraph.memory.model import GraphShape, PartShape

    n = NODES // parts
    rho = rho16 * (parts / 16) ** growth
    h = min(int(rho * n), NODES - n)
    e = 2 * EDGES // parts
    part = PartShape(0, n, h, e, h, TRAIN // parts, min(e, int(1.7 * h)))
    return GraphShape("ogbn-papers100M (described)", parts, FEATURES, CLASSES, (part,) * parts), rho


def rates() -> tuple[float, float]:
    """(spmm entries x columns per second, GEMM flop/s), one thread, measured now."""
    import numpy as np
    import torch

    from fullgraph.kernels import CSRMatrix, spmm

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n, deg, width = 200_000, 50, HIDDEN
    indptr = np.arange(0, n * deg + 1, deg, dtype=np.int64)
    cols = np.sort(rng.integers(0, n, n * deg).reshape(n, deg), axis=1).reshape(-1)
    a = CSRMatrix(indptr, cols, np.full(n * deg, 1.0 / deg, np.float32), n)
    x = torch.randn(n, width)
    spmm(a, x)
    t0 = time.perf_counter()
    for _ in range(3):
        spmm(a, x)
    spmm_rate = 3 * n * deg * width / (time.perf_counter() - t0)
    h, w = torch.randn(n, width), torch.randn(width, width)
    torch.mm(h, w)
    t0 = time.perf_counter()
    for _ in range(3):
        torch.mm(h, w)
    gemm_rate = 3 * 2 * n * width * width / (time.perf_counter() - t0)
    return spmm_rate, gemm_rate


def epoch_seconds(
    n: int, h: int, s: int, e: int, spmm_rate: float, gemm_rate: float, gbps: float
) -> tuple[float, float]:
    """(compute s on one thread, halo s) of one training epoch of one rank (module docstring):
    ``n`` inner rows, ``h`` halo rows received, ``s`` rows sent, ``e`` stored edges."""
    F, H, C = FEATURES, HIDDEN, CLASSES
    spmm_work = e * (F + H + C) + e * (H + C)
    dims = [(F, H), (H, H), (H, C)]
    flops = 0.0
    for i, (d, o) in enumerate(dims):
        flops += 2 * n * d * o * (2 + (2 if i == 0 else 4))
    halo_bytes = 4 * (s * (F + H + C) + h * (H + C))  # what a rank sends, fwd and bwd
    return spmm_work / spmm_rate + flops / gemm_rate, halo_bytes / (gbps * 1e9)


def main() -> None:
    """Print the projection for P = 16, 32, 64, 128 and write the CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--halo-ratio", type=float, default=1.0, help="rho_16: halo rows / (N/P)")
    ap.add_argument("--halo-growth", type=float, default=0.5, help="gamma: rho grows as P^gamma")
    ap.add_argument("--bandwidth", type=float, default=12.5, help="GB/s per rank (100 Gb/s)")
    ap.add_argument("--floor-mb", type=float, default=None, help="default: measured now")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()

    from fullgraph.memory.model import TERMS, measure_floor, predict
    from fullgraph.training.config import TrainConfig

    cfg = TrainConfig(model="sage", layers=LAYERS, hidden=HIDDEN, dropout=0.5)
    floor = (
        int(a.floor_mb * 2**20) if a.floor_mb is not None else measure_floor(cfg, FEATURES, CLASSES)
    )
    spmm_rate, gemm_rate = rates()
    print(
        f"floor {floor / 2**20:.0f} MiB; spmm {spmm_rate / 1e9:.2f} G entry-cols/s, GEMM "
        f"{gemm_rate / 1e9:.1f} GFLOP/s (one thread); halo rho_16 {a.halo_ratio}, growth "
        f"P^{a.halo_growth}; {a.bandwidth} GB/s"
    )
    writer = CSVWriter(Path(a.out) / "scale_projection.csv")
    head = "P      n/rank  halo/rank  rho   " + "  ".join(f"{t:>11s}" for t in TERMS)
    print(head + "   total GB  SAR GB/machine  compute s (1 thread)  halo s")
    for parts in (16, 32, 64, 128):
        graph, rho = shape(parts, a.halo_ratio, a.halo_growth)
        pred = predict(graph, cfg, floor)[0]
        p = graph.parts[0]
        comp, comm = epoch_seconds(
            p.num_inner, p.num_halo, p.num_send, p.num_edges, spmm_rate, gemm_rate, a.bandwidth
        )
        terms = "  ".join(f"{pred.terms[t] / 1e9:11.2f}" for t in TERMS)
        sar = SAR_GB.get(parts)
        print(
            f"{parts:<5d} {p.num_inner:9d} {p.num_halo:10d} {rho:5.2f} {terms} "
            f"{pred.total / 1e9:10.1f} {sar if sar else '-':>15} {comp:21.0f} {comm:7.1f}"
        )
        writer.write("scale_projection", "model", "peak_rss", "GB", parts, pred.total / 1e9, parts)
        writer.write("scale_projection", "model", "epoch_compute_1thread", "s", parts, comp, parts)
        writer.write("scale_projection", "model", "epoch_halo", "s", parts, comm, parts)


if __name__ == "__main__":
    main()
