"""``fullgraph plan project``: the projection's table, and its bad input as one line.

- ``--preset`` prints one line per machine count whose memory, halo and epoch figures are the
  library's projection of the described graph (:func:`~fullgraph.memory.projection.project`);
- ``--parts DIR`` prints one line per rank of a partition on disk and every machine's memory;
- machines <= 0, an unknown preset, neither or both sources, one cost without the other, and
  model options before ``project`` are one line, exit 2.
"""

from __future__ import annotations

import pytest
from cli_run import assert_one_line, run_cli

from fullgraph.memory.projection import Costs, HaloModel, described_shape, preset, project
from fullgraph.training.config import TrainConfig

GIVEN = ["--edge-ns", "0.5", "--row-us", "20", "--floor-mb", "300", "--bandwidth", "10"]
MODEL = ["--model", "sage", "--layers", "3", "--hidden", "256"]


def test_preset_table_is_the_projection(capsys) -> None:
    code, out, err = run_cli(
        ["plan", "project", "--preset", "papers100M", "--machines", "16,128", *GIVEN, *MODEL],
        capsys,
    )
    assert code == 0, err
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["16", "128"]
    cfg = TrainConfig(model="sage", layers=3, hidden=256)
    costs = Costs(0.5e-9, 20e-6, 10e9)
    for row, machines in zip(rows, (16, 128), strict=True):
        graph = described_shape(preset("papers100M"), machines, HaloModel())
        r = project(graph, cfg, 300 * 2**20, costs)[0]
        assert int(row[2]) == r.part.num_inner and int(row[3]) == r.part.num_halo
        assert row[4] == f"{r.memory.total / 1e9:.2f}" and int(row[6]) == r.halo_rows
        assert row[7] == f"{r.halo_bytes / 1e9:.2f}" and row[10] == f"{r.epoch_s:.2f}"
    assert "given" in out


def test_ranks_per_machine_multiply_the_memory(capsys) -> None:
    args = ["plan", "project", "--preset", "products", "--machines", "2", *GIVEN]
    code, out, _ = run_cli([*args, "--ranks-per-machine", "2", "--hidden", "32"], capsys)
    assert code == 0
    row = next(ln.split() for ln in out.splitlines() if ln.strip().startswith("2 "))
    assert row[1] == "4" and float(row[5]) == pytest.approx(2 * float(row[4]), abs=0.011)


def test_parts_prints_every_rank(capsys, small_partitions) -> None:
    parts = str(small_partitions[2])
    code, out, err = run_cli(
        ["plan", "project", "--parts", parts, *GIVEN, "--hidden", "32"], capsys
    )
    assert code == 0, err
    assert "machine 1:" in out and "predicted epoch" in out
    assert sum(ln.strip().startswith(("0 ", "1 ")) for ln in out.splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--preset", "papers100M", "--machines", "0,16"], "--machines needs counts >= 1"),
        (["--preset", "papers100M", "--machines", "-4"], "--machines needs counts >= 1"),
        (["--preset", "papers100M", "--machines", "a"], "comma-separated integers"),
        (["--preset", "papers1B"], "unknown preset 'papers1B'"),
        ([], "give one of --preset"),
        (["--preset", "arxiv", "--parts", "x"], "give one of --preset"),
        (["--preset", "arxiv", "--edge-ns", "1"], "--edge-ns and --row-us go together"),
        (["--preset", "arxiv", "--bandwidth", "0"], "--bandwidth"),
    ],
)
def test_bad_input_is_one_line(capsys, args: list[str], needle: str) -> None:
    code, _, err = run_cli(["plan", "project", *args], capsys)
    assert_one_line(code, err, needle, prefix="fullgraph plan")


def test_model_options_before_the_kind_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        run_cli(["plan", "--hidden", "64", "project", "--preset", "arxiv"], capsys)
    assert exc.value.code == 2
    assert "go after it" in capsys.readouterr().err
