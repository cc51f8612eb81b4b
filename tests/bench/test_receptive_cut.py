"""``bench.receptive_cut`` on a tiny synthetic graph: the size rows of every hop count and split
set, and the step table's whole-graph and cut runs with the same losses."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sizes_and_the_same_losses(tmp_path: Path) -> None:
    root = tmp_path / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fullgraph.cli",
            "data",
            "synth",
            "--preset",
            "tiny",
            "--name",
            "tiny",
            "--root",
            str(root),
        ],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.receptive_cut",
            "--datasets",
            "tiny",
            "--root",
            str(root),
            "--hops",
            "1",
            "2",
            "--train-epochs",
            "2",
            "--hidden",
            "16",
            "--layers",
            "1",
            "--out-dir",
            str(tmp_path / "out"),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 4 + 1, done.stdout  # 2 split sets x 2 hop counts, then the step row
    assert rows[-1].endswith("| yes |"), rows[-1]
    with open(tmp_path / "out" / "receptive_cut.csv", newline="") as f:
        metrics = {r["metric"] for r in csv.DictReader(f)}
    assert {"kept_nodes", "kept_edges", "step_time", "peak_rss"} <= metrics
