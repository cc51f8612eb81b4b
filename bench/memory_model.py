"""The memory model against measurement: predicted and measured peak RSS of every rank.

For every case (a partition directory and a model), in one run:

- the prediction: :func:`fullgraph.memory.model.predict` from the partition's
  ``meta.json``, with the process floor measured in this process
  (:func:`~fullgraph.memory.model.measure_floor`, as ``fullgraph plan`` does);
- the measurement: ``mpirun -n P python -m bench.memory_model --wrap -- fullgraph train
  --parts DIR --model M --layers L --hidden H --epochs E``, where every rank's wrapper reports
  the peak resident memory of its ``fullgraph train`` (``getrusage(RUSAGE_CHILDREN)``).

Products-size cases run under ``flock /tmp/fullgraph-bigjob.lock`` (one big job at a time on a
shared machine). Writes ``OUT/memory_model.csv`` (long format, ``bench/common.py``) and prints
one line per rank: predicted, measured, measured / predicted (target within 0.85-1.15).

Usage: ``python -m bench.memory_model --parts-root /tmp/fg-data/parts --cases arxiv-2,arxiv-4
--models sage,gcn --epochs 2``.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

from bench.child import bench_command, run_checked
from bench.common import CSVWriter

ROOT = Path(__file__).resolve().parents[1]
LOCK = "/tmp/fullgraph-bigjob.lock"
#: Parts with more stored edges than this run under the machine-wide lock.
BIG_EDGES = 10_000_000


def wrap(cmd: list[str]) -> int:
    """Run ``cmd``; print ``PEAK <rank> <KiB>``, its peak resident memory, on stdout."""
    rc = subprocess.call(cmd, close_fds=False)  # keeps the launcher's PMI descriptor
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"PEAK {rank} {peak}", flush=True)
    return rc


def measure(parts: Path, ranks: int, train_args: list[str], big: bool) -> dict[int, float]:
    """Peak RSS (MiB) of every rank of one ``fullgraph train`` run."""
    venv = Path(sys.executable).parent
    mpirun = str(venv / "mpirun") if (venv / "mpirun").exists() else "mpirun"
    cmd = [
        mpirun,
        "-n",
        str(ranks),
        *bench_command("memory_model", "--wrap", "--"),
        str(venv / "fullgraph"),
        "train",
        "--parts",
        str(parts),
        *train_args,
    ]
    if big:
        cmd = ["flock", LOCK, *cmd]
    print("  $ " + " ".join(cmd), flush=True)
    proc = run_checked(cmd)
    # ranks write to one pipe: a PEAK record may share a line with another rank's output
    return {int(r): int(kib) / 1024 for r, kib in re.findall(r"PEAK (\d+) (\d+)", proc.stdout)}


def main() -> None:
    """Predict and measure every case; print the table; write the CSV rows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wrap", action="store_true", help="(internal) run the command after --")
    ap.add_argument("--parts-root", default="/tmp/fg-data/parts")
    ap.add_argument("--cases", default="arxiv-2,arxiv-4,arxiv-8", help="partition names")
    ap.add_argument("--models", default="sage,gcn")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--extra", default="", help="more `fullgraph train` options, one string")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a, rest = ap.parse_known_args()
    if a.wrap:
        sys.exit(wrap(rest[1:] if rest[:1] == ["--"] else rest))

    from fullgraph.memory.model import GraphShape, measure_floor, predict
    from fullgraph.partition import read_meta
    from fullgraph.training.config import TrainConfig

    writer = CSVWriter(Path(a.out) / "memory_model.csv")
    floors: dict[tuple[str, int, int], int] = {}
    print("case            model  rank  predicted MiB  measured MiB  measured/predicted")
    for case in a.cases.split(","):
        parts = Path(a.parts_root) / case
        meta, _ = read_meta(parts)
        graph = GraphShape.from_meta(meta)
        big = max(p.num_edges for p in graph.parts) > BIG_EDGES
        for model in a.models.split(","):
            train_args = [
                "--model",
                model,
                "--layers",
                str(a.layers),
                "--hidden",
                str(a.hidden),
                "--epochs",
                str(a.epochs),
                *a.extra.split(),
            ]
            parser = argparse.ArgumentParser()
            TrainConfig.add_arguments(parser)  # the run's options, parsed as train parses them
            cfg = TrainConfig.from_args(parser.parse_args(train_args))
            key = (model, graph.num_features, graph.num_classes)
            if key not in floors:
                floors[key] = measure_floor(cfg, graph.num_features, graph.num_classes)
            preds = predict(graph, cfg, floors[key])
            peaks = measure(parts, graph.num_parts, train_args, big)
            for p in preds:
                got, want = peaks.get(p.rank, float("nan")), p.total / 2**20
                print(
                    f"{case:15s} {model:5s} {p.rank:5d} {want:14.0f} {got:13.0f} "
                    f"{got / want:19.3f}  (peak in {p.phase})",
                    flush=True,
                )
                x = f"{case}/{model}/rank{p.rank}"
                writer.write("memory_model", "model", "peak_rss", "MiB", x, want, graph.num_parts)
                writer.write("memory_model", "measured", "peak_rss", "MiB", x, got, graph.num_parts)


if __name__ == "__main__":
    main()
