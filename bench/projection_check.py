"""The projection against measurement: predicted and measured epoch time and peak memory.

For every case (a synthetic graph at a size, partitioned into ``P`` METIS parts), in one run:

- the prediction: :func:`fullgraph.memory.projection.project` on the partition's
  ``meta.json`` (what ``fullgraph plan project --parts DIR`` prints), with the process floor
  (:func:`~fullgraph.memory.model.measure_floor`) and the per-edge and per-row costs
  (:func:`~fullgraph.memory.cost_probe.probe_costs`: the model's training steps in one process
  on part 0's inner rows with all their edges and every 8th, and two-rank runs on random
  graphs for the per-halo-row cost and the sharing factor) measured just before the run, one
  thread a rank (a rank's share of this machine's cores at ``P`` ranks);
- the measurement: ``mpirun -n P fullgraph train --parts DIR ... --log-json`` (the memory
  model bench's wrapper gives every rank's peak RSS), epoch time the median of the training
  steps after the first (``epoch_s``, the slowest rank's; evaluation is not in it), halo bytes
  of an epoch that does not evaluate (summed over ranks, against the replay's).

Every case (probe and run) holds ``/tmp/fullgraph-bigjob.lock`` (one big job at a time on a
shared machine). Writes ``OUT/projection_check.csv`` and
prints one line per case: predicted, measured, measured / predicted (target 0.85-1.15).

Timing on a shared machine: every case waits (up to ``--max-wait`` s) for the 1-minute load
average to fall below ``--quiet-load``, and both sides take the fastest step (the probe's
fastest of three, the run's fastest epoch after the first), the least disturbed; the median
epoch is printed beside it.

Usage: ``python -m bench.projection_check --root /tmp/fg-proj --cases
arxiv:0.5,arxiv:1,products:0.25``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from bench.common import CSVWriter
from bench.memory_model import LOCK, measure

ROOT = Path(__file__).resolve().parents[1]


def prepare(root: Path, preset: str, scale: float, parts: int) -> Path:
    """``preset`` at ``scale`` times its nodes and edges, in ``parts`` METIS parts (reused)."""
    from fullgraph.datasets.synthetic import PRESETS, generate
    from fullgraph.partition import partition_graph

    out = root / f"{preset}-{scale:g}-{parts}"
    if (out / "meta.json").exists():
        return out
    c = PRESETS[preset]
    graph = generate(
        preset, seed=0, num_nodes=int(c.num_nodes * scale), num_edges=int(c.num_edges * scale)
    )
    partition_graph(graph, parts, out, method="metis", seed=0, force=True)
    return out


def wait_quiet(load: float, max_wait: float) -> float:
    """Wait until the 1-minute load average is below ``load`` (at most ``max_wait`` s); return
    it."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def epochs_of(log: Path) -> list[dict]:
    """The per-epoch records of a ``--log-json`` file."""
    return [r for r in map(json.loads, log.read_text().splitlines()) if "epoch_s" in r]


def main() -> None:
    """Predict and measure every case; print the table; write the CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/fg-proj", help="datasets and partitions")
    ap.add_argument("--cases", default="arxiv:0.5,arxiv:1,products:0.25", help="preset:scale")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--model", default="sage")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--bandwidth", type=float, default=5.0, help="GB/s a rank sends (one box)")
    ap.add_argument("--no-halo-probe", action="store_true", help="no per-halo-row cost")
    ap.add_argument("--quiet-load", type=float, default=1.0, help="1-minute load to wait for")
    ap.add_argument("--max-wait", type=float, default=300.0, help="seconds to wait for it")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()

    from fullgraph.memory.cost_probe import probe_costs, probe_rows
    from fullgraph.memory.model import GraphShape, measure_floor
    from fullgraph.memory.projection import project, step_exchanges
    from fullgraph.partition import read_meta
    from fullgraph.training.config import TrainConfig

    root = Path(a.root)
    root.mkdir(parents=True, exist_ok=True)
    writer = CSVWriter(Path(a.out) / "projection_check.csv")
    model = ["--model", a.model, "--layers", str(a.layers), "--hidden", str(a.hidden)]
    parser = argparse.ArgumentParser()
    TrainConfig.add_arguments(parser)  # the run's options, parsed as train parses them
    cfg = TrainConfig.from_args(parser.parse_args(model))
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    rows = []
    for case in a.cases.split(","):
        preset, scale = case.split(":")
        parts = prepare(root, preset, float(scale), a.ranks)
        meta, _ = read_meta(parts)
        graph = GraphShape.from_meta(meta)
        share = meta["num_train_global"] / meta["num_nodes"]
        floor = measure_floor(cfg, graph.num_features, graph.num_classes)
        lock = open(LOCK, "a")  # held for the case (probe and run), released below
        fcntl.flock(lock, fcntl.LOCK_EX)
        load = wait_quiet(a.quiet_load, a.max_wait)
        costs = probe_costs(
            cfg,
            graph.num_features,
            graph.num_classes,
            threads=1,
            rows=probe_rows(graph),
            train_share=share,
            bandwidth=a.bandwidth * 1e9,
            halo=not a.no_halo_probe,
            parts=str(parts),  # part 0's inner rows alone, one process: the graph's locality
        )
        ranks = project(graph, cfg, floor, costs, a.ranks)  # the ranks share this machine
        log = root / f"{parts.name}.jsonl"
        log.unlink(missing_ok=True)
        log.with_suffix(".model.pt").unlink(missing_ok=True)  # the run's model file beside it
        train = [*model, "--epochs", str(a.epochs), "--eval-every", "1000", "--log-json", str(log)]
        peaks = measure(parts, a.ranks, train, big=False)  # the lock is held here
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        recs = epochs_of(log)
        step = min(r["epoch_s"] for r in recs[1:])
        middle = statistics.median(r["epoch_s"] for r in recs[1:])
        halo = recs[1]["halo_bytes"]  # an epoch that did not evaluate
        want = {
            "epoch": max(r.epoch_s for r in ranks),
            "peak": max(r.memory.total for r in ranks) / 2**20,
            "halo": sum(x.bytes_sent for p in graph.parts for x in step_exchanges(p, graph, cfg)),
        }
        got = {"epoch": step, "peak": max(peaks.values()), "halo": halo}
        line = (
            f"{parts.name:22s} n/rank {max(p.num_inner for p in graph.parts):7d} e/rank "
            f"{max(p.num_edges for p in graph.parts):9d}  costs {costs.edge_s * 1e9:.1f} ns/edge "
            f"{costs.row_s * 1e6:.2f} us/row {costs.halo_row_s * 1e6:.2f} us/halo row "
            f"x{costs.shared:.2f}  floor "
            f"{floor / 2**20:.0f} MiB  load {load:.2f} -> "
            f"{os.getloadavg()[0]:.2f}"
        )
        for key, unit in (("epoch", "s"), ("peak", "MiB"), ("halo", "B")):
            line += f"\n    {key:6s} predicted {want[key]:14.3f} {unit:3s} measured "
            line += f"{got[key]:14.3f}  measured/predicted {got[key] / want[key]:.3f}"
            writer.write("projection_check", "model", key, unit, parts.name, want[key], a.ranks)
            writer.write("projection_check", "measured", key, unit, parts.name, got[key], a.ranks)
        line += "\n    epochs " + ", ".join(f"{r['epoch_s']:.3f}" for r in recs)
        line += f" (median after the first {middle:.3f}: {middle / want['epoch']:.3f})"
        line += f"\n    probe: {costs.source}"
        print(line, flush=True)
        rows.append(line)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
