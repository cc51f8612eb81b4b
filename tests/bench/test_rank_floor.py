"""``bench.rank_floor``'s parts: reading ``/proc/self/status``, the import meter, the ``mpirun``
line, the plan's floor read from rank 0's output, the table; and (slow) the bench at P = 2."""

from __future__ import annotations

import csv
import importlib
import sys
from pathlib import Path

import pytest

from bench import rank_floor as bench
from bench.common import CSVWriter


def test_memory_status_reads_the_resident_parts(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text(
        "Name:\tpython\nVmHWM:\t  512000 kB\nVmRSS:\t  409600 kB\nRssAnon:\t  204800 kB\n"
        "RssFile:\t  198656 kB\nRssShmem:\t    6144 kB\nThreads:\t5\n"
    )
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text(
        "00400000-7ffd rw-p 00000000 00:00 0    [rollup]\nRss:  409600 kB\nPss:  256000 kB\n"
        "Shared_Clean:  153600 kB\nPrivate_Clean:  51200 kB\nPrivate_Dirty:  204800 kB\n"
    )
    got = bench.memory_status(str(status), str(rollup))
    assert got == {
        "VmRSS": 400.0,
        "RssAnon": 200.0,
        "RssFile": 194.0,
        "RssShmem": 6.0,
        "VmHWM": 500.0,
        "Pss": 250.0,
        "Uss": 250.0,
    }
    assert bench.memory_status(str(status), str(tmp_path / "none"))["Uss"] == 0.0
    here = bench.memory_status()
    assert here["VmRSS"] > 0 and set(here) == set(bench.FIELDS + bench.ROLLUP)
    assert 0 < here["Uss"] <= here["Pss"] <= here["VmRSS"] + 1


def test_the_import_meter_counts_each_module_it_sees_load() -> None:
    seen: list[str] = []
    meter = bench.ImportMeter({"colorsys": lambda m: seen.append(m.__name__)})
    sys.modules.pop("colorsys", None)  # loaded afresh, through the meter
    sys.meta_path.insert(0, meter)
    try:
        importlib.import_module("colorsys")
    finally:
        sys.meta_path.remove(meter)
    assert list(meter.own) == ["colorsys"] and list(meter.by_package()) == ["colorsys"]
    assert seen == ["colorsys"] and meter.after == {}  # called once, then forgotten
    assert sys.modules["colorsys"].__loader__.get_filename("colorsys").endswith("colorsys.py")


def test_rank_command_runs_train_on_every_rank(tmp_path: Path) -> None:
    cmd = bench.rank_command(tmp_path / "parts", 4, tmp_path / "out", breakdown=True)
    assert Path(cmd[0]).name == "mpirun" and cmd[1:3] == ["-n", "4"]
    i = cmd.index("--")
    assert cmd[i - 5 : i] == [
        "-m",
        "bench.rank_floor",
        "--rank",
        str(tmp_path / "out"),
        "--breakdown",
    ]
    assert cmd[i + 1 : i + 4] == ["train", "--parts", str(tmp_path / "parts")]
    assert cmd[-2:] == ["--threads", "1"] and "gcn" in cmd


def test_plan_floor_is_read_from_rank_0s_plan_line() -> None:
    line = (
        "memory plan: rank 0 peak 514 MiB in backward, layer 1 (graph structure 0, features 0, "
        "saved activations 1, process floor 512 MiB)"
    )
    assert bench.plan_floor(f"epoch 1 ...\n{line}\nfinal: ...") == 512.0
    assert bench.plan_floor("memory plan: none (a registered layer kind)") is None


def test_parse_args_splits_off_the_ranks_command_line() -> None:
    a, rest = bench.parse_args(["--ranks", "2,4,8", "--", "train", "--parts", "p"])
    assert a.ranks == [2, 4, 8] and rest == ["train", "--parts", "p"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--ranks", "0"])


def test_report_prints_every_stage_and_writes_rows(tmp_path: Path) -> None:
    stage = {"VmRSS": 400.0, "RssAnon": 200.0, "RssFile": 194.0, "RssShmem": 6.0, "VmHWM": 450.0}
    result = {
        "ranks": {
            0: {
                "stages": {"imports": stage, "rank start": stage},
                "packages": {"torch": 1},
                "packages_anon": {"torch": 0.5},
            }
        },
        "plan_floor": 405.0,
    }
    writer = CSVWriter(tmp_path / "rank_floor.csv")
    lines = bench.report(2, result, writer)
    assert [ln.split()[3:5] for ln in lines[:2]] == [["imports", "VmRSS"], ["rank", "start"]]
    assert "torch 1.0 (0.5)" in lines[2] and lines[-1].endswith("405")
    with open(tmp_path / "rank_floor.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * len(bench.FIELDS + bench.ROLLUP) + 1
    assert {r["x"] for r in rows} == {"P2/rank0"} and rows[-1]["metric"] == "process_floor"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bench_measures_every_rank_at_p2(tmp_path: Path) -> None:
    """Every rank notes every stage; a breakdown run, which keeps the libraries' pages,
    peaks higher at start-up and holds more file-backed pages after the epochs."""
    from fullgraph.resources import LIBRARY_PAGES_ENV

    assert bench.LIBRARY_PAGES_ENV == LIBRARY_PAGES_ENV
    parts = bench.prepare(tmp_path, [2])
    result = bench.measure(parts[2], 2, tmp_path / "records", breakdown=False)
    kept = bench.measure(parts[2], 2, tmp_path / "kept", breakdown=True)
    assert sorted(result["ranks"]) == [0, 1] and result["plan_floor"] is not None
    for r, record in result["ranks"].items():
        stages, kept_stages = record["stages"], kept["ranks"][r]["stages"]
        assert list(stages) == [name for name, _ in bench.STAGES] == list(kept_stages)
        assert stages["imports"]["VmHWM"] < kept_stages["imports"]["VmHWM"]
        assert stages["after epochs"]["RssFile"] < kept_stages["after epochs"]["RssFile"]
        packages = kept["ranks"][r]["packages_anon"]
        assert "torch" in packages and "numba" in packages and "packages" not in record
