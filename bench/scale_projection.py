"""papers100M on paper: memory, halo traffic and epoch time at 16-128 machines, beside SAR's.

The projection is the library's (:mod:`fullgraph.memory.projection`, what ``fullgraph plan
project --preset papers100M`` prints): ogbn-papers100M described to the memory model in equal
parts (111,059,956 nodes, 1,615,685,872 edges stored both ways, 128 features, 172 classes,
1,207,179 training nodes), GraphSAGE 3 x 256, dropout 0.5, the halo of ``--halo-ratio`` /
``--halo-growth``, per-edge, per-row and per-halo-row costs measured now
(:func:`~fullgraph.memory.cost_probe.probe_costs`, one thread a rank unless ``--threads``;
``--edge-ns`` / ``--row-us`` / ``--halo-row-us`` give them) and ``--bandwidth`` GB/s a rank. Beside
it SAR's measured memory per machine (Mostafa, MLSys 2022) at 32 / 64 / 128 machines.

Usage: ``python -m bench.scale_projection [--halo-ratio 1 --halo-growth 0.5] [--floor-mb 383]``;
prints one line per machine count and writes ``OUT/scale_projection.csv``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import CSVWriter

ROOT = Path(__file__).resolve().parents[1]
#: SAR (Mostafa, MLSys 2022), papers100M, GraphSAGE: measured memory per machine (GB).
SAR_GB = {32: 95, 64: 47, 128: 25}


def main() -> None:
    """Print the projection for 16, 32, 64, 128 machines and write the CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machines", default="16,32,64,128")
    ap.add_argument("--ranks-per-machine", type=int, default=1)
    ap.add_argument("--halo-ratio", type=float, default=1.0, help="rho_16: halo rows / (N/P)")
    ap.add_argument("--halo-growth", type=float, default=0.5, help="gamma: rho grows as P^gamma")
    ap.add_argument("--bandwidth", type=float, default=12.5, help="GB/s per rank (100 Gb/s)")
    ap.add_argument("--threads", type=int, default=1, help="threads of a rank in the probe")
    ap.add_argument("--edge-ns", type=float, default=None, help="given per-edge cost (ns)")
    ap.add_argument("--row-us", type=float, default=None, help="given per-row cost (us)")
    ap.add_argument("--halo-row-us", type=float, default=0.0, help="given per-halo-row cost")
    ap.add_argument("--floor-mb", type=float, default=None, help="default: measured now")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()

    from fullgraph.memory.cost_probe import PROBE_ROWS, probe_costs
    from fullgraph.memory.model import measure_floor
    from fullgraph.memory.projection import Costs, HaloModel, described_shape, preset, project
    from fullgraph.training.config import TrainConfig

    size = preset("papers100M")
    cfg = TrainConfig(model="sage", layers=3, hidden=256, dropout=0.5)
    F, C = size.num_features, size.num_classes
    floor = int(a.floor_mb * 2**20) if a.floor_mb is not None else measure_floor(cfg, F, C)
    if a.edge_ns is not None and a.row_us is not None:
        costs = Costs(
            a.edge_ns * 1e-9, a.row_us * 1e-6, a.bandwidth * 1e9, halo_row_s=a.halo_row_us * 1e-6
        )
    else:
        share = size.num_train / size.num_nodes
        costs = probe_costs(
            cfg, F, C, threads=a.threads, rows=PROBE_ROWS, train_share=share,
            bandwidth=a.bandwidth * 1e9, halo=True,
        )  # fmt: skip
    halo = HaloModel(a.halo_ratio, a.halo_growth)
    k = a.ranks_per_machine
    print(
        f"floor {floor / 2**20:.0f} MiB; {costs.edge_s * 1e9:.2f} ns an edge, "
        f"{costs.row_s * 1e6:.2f} us a row, {costs.halo_row_s * 1e6:.2f} us a halo row "
        f"({costs.source}); halo rho_16 {a.halo_ratio}, "
        f"growth P^{a.halo_growth}; {a.bandwidth} GB/s a rank; {k} rank(s) a machine"
    )
    writer = CSVWriter(Path(a.out) / "scale_projection.csv")
    print(
        "machines  rows/rank  halo/rank  GB/rank  GB/machine  SAR GB/machine  halo GB/step  "
        "compute s  halo s  epoch s"
    )
    for m in (int(t) for t in a.machines.split(",")):
        r = project(described_shape(size, m * k, halo), cfg, floor, costs, k)[0]
        sar = SAR_GB.get(m)
        print(
            f"{m:8d}  {r.part.num_inner:9d}  {r.part.num_halo:9d}  {r.memory.total / 1e9:7.1f}  "
            f"{k * r.memory.total / 1e9:10.1f}  {sar if sar else '-':>14}  "
            f"{r.halo_bytes / 1e9:12.2f}  {r.compute_s:9.1f}  {r.send_s:6.2f}  {r.epoch_s:7.1f}"
        )
        for metric, unit, y in (
            ("peak_rss_machine", "GB", k * r.memory.total / 1e9),
            ("halo_bytes_step", "GB", r.halo_bytes / 1e9),
            ("epoch_compute", "s", r.compute_s),
            ("epoch_halo", "s", r.send_s),
        ):
            writer.write("scale_projection", "model", metric, unit, m, y, m * k)


if __name__ == "__main__":
    main()
