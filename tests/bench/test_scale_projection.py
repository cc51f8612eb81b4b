"""``bench.scale_projection``: the library's projection of papers100M beside SAR's figures.

With the costs and the floor given it measures nothing: one line per machine count whose
memory is :func:`~fullgraph.memory.projection.project`'s, SAR's figure where there is one, and
the CSV rows it writes.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from bench import scale_projection
from fullgraph.memory.projection import Costs, HaloModel, described_shape, preset, project
from fullgraph.training.config import TrainConfig


def test_lines_are_the_projection_beside_sar(monkeypatch, capsys, tmp_path: Path) -> None:
    given = ["--edge-ns", "100", "--row-us", "20", "--halo-row-us", "2", "--floor-mb", "400"]
    argv = ["scale_projection", "--machines", "32,128", *given, "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    scale_projection.main()
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln[:8].strip().isdigit()]
    assert [r[0] for r in rows] == ["32", "128"] and [r[5] for r in rows] == ["95", "25"]
    cfg = TrainConfig(model="sage", layers=3, hidden=256, dropout=0.5)
    costs = Costs(100e-9, 20e-6, 12.5e9, halo_row_s=2e-6)
    for row, machines in zip(rows, (32, 128), strict=True):
        graph = described_shape(preset("papers100M"), machines, HaloModel())
        r = project(graph, cfg, 400 * 2**20, costs)[0]
        assert float(row[3]) == pytest.approx(r.memory.total / 1e9, abs=0.051)
        assert float(row[9]) == pytest.approx(r.epoch_s, abs=0.051)
    with open(tmp_path / "scale_projection.csv") as f:
        written = list(csv.DictReader(f))
    assert len(written) == 8 and {w["x"] for w in written} == {"32", "128"}
