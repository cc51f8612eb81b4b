"""``bench.synthetic_memory``: the sampled peaks of a child ``data synth`` and its CSV rows."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from bench import synthetic_memory


def test_rows_per_scale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rows.csv"
    argv = ["synthetic_memory", "--preset", "tiny", "--scales", "1", "1/2", "--root"]
    monkeypatch.setattr(sys, "argv", [*argv, str(tmp_path), "--out", str(out)])
    synthetic_memory.main()
    with open(out) as f:
        rows = list(csv.DictReader(f))
    got = {(r["x"], r["metric"]): float(r["y"]) for r in rows}
    for scale in ("1", "1/2"):
        assert got[(scale, "RssAnon")] > 0 and got[(scale, "VmHWM")] >= got[(scale, "RssAnon")]
        assert got[(scale, "disk_MiB")] > 0 and got[(scale, "seconds")] > 0
    assert got[("1", "disk_MiB")] > got[("1/2", "disk_MiB")]  # half the graph, smaller files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]  # datasets removed


def test_a_failing_command_is_named() -> None:
    with pytest.raises(SystemExit, match="failed"):
        synthetic_memory.run_sampled([sys.executable, "-c", "raise SystemExit(3)"])
