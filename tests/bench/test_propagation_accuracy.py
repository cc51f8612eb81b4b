"""``bench.propagation_accuracy`` keeps working: its argument checks, the flags of every run,
and one tiny case end to end (the generated graph, 2 epochs, one seed, every method).
"""

from __future__ import annotations

import csv

import pytest

from bench import propagation_accuracy as bench


def test_parse_args_defaults_and_refusals() -> None:
    a = bench.parse_args([])
    assert a.datasets == list(bench.DEFAULT_DATASETS)
    assert a.methods == list(bench.METHODS) and a.seeds == [0, 1, 2]
    assert bench.plan_runs(a) == list(bench.RUNS)
    a = bench.parse_args(["--methods", "mlp+cs,sgc"])
    assert bench.plan_runs(a) == ["mlp", "sgc"]
    for bad in (["--datasets", "cora"], ["--methods", "gat"], ["--epochs", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_method_flags() -> None:
    tol = bench.DATASETS["tolokers"]
    gcn = bench.method_flags(tol, "gcn")
    assert gcn[gcn.index("--model") + 1] == "gcn" and "--residual" in gcn
    assert gcn[gcn.index("--hidden") + 1] == "64"
    sgc = bench.method_flags(bench.DATASETS["citeseer"], "sgc")
    assert sgc[sgc.index("--model") + 1] == "sgc" and "--residual" not in sgc
    appnp = bench.method_flags(tol, "appnp")
    assert appnp[appnp.index("--hops") + 1] == "10" and "--residual" in appnp


def test_make_root_links_read_only(tmp_path) -> None:
    shared = tmp_path / "shared"
    (shared / "citeseer" / "raw").mkdir(parents=True)
    root = bench.make_root(tmp_path / "work", ["citeseer", "tiny"], shared)
    link = root / "citeseer" / "raw"
    assert link.is_symlink() and link.resolve() == (shared / "citeseer" / "raw").resolve()
    with pytest.raises(SystemExit, match="missing"):
        bench.make_root(tmp_path / "work2", ["tolokers"], shared)


@pytest.mark.timeout(300)
def test_tiny_case_end_to_end(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["--datasets", "tiny", "--seeds", "0", "--epochs", "2", "--out", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    for label in bench.METHODS.values():
        assert f"| {label} |" in printed
    rows = list(csv.DictReader(open(out / "propagation_accuracy.csv")))
    tests = {r["what"]: float(r["y"]) for r in rows if r["metric"] == "test"}
    assert set(tests) == {f"tiny {m}" for m in bench.METHODS}
    assert all(0 <= y <= 100 for y in tests.values())
    # C&S propagates the training labels: on the tiny graph it lifts the 2-epoch MLP
    assert tests["tiny mlp+cs"] > tests["tiny mlp"]


def test_table_from_csv_keeps_the_last_row_per_seed(tmp_path, capsys) -> None:
    path = tmp_path / "propagation_accuracy.csv"
    rows = bench.CSVWriter(path)
    for seed, y in ((0, 70.0), (1, 72.0), (1, 74.0)):  # seed 1 rerun: 74 replaces 72
        rows.write("citeseer sgc", "fullgraph", "test", "%", f"seed{seed}", y)
    rows.write("citeseer sgc", "fullgraph", "wall_time", "s", "seed0", 3.0)
    assert bench.read_csv_results(path) == {("citeseer", "sgc"): [70.0, 74.0]}
    assert bench.main(["--table", str(path)]) == 0
    assert "| SGC (K=2) | 72.0 ± 2.8 | 71.9 ± 0.1 |" in capsys.readouterr().out
