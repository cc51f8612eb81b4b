"""``fullgraph plan`` and the memory model behind it (:mod:`fullgraph.memory.model`).

- bad input: a missing directory, a part file failing its checksum, an unmodelled model, a
  node too small: one line on stderr, exit status 2, nothing written;
- the terms of every rank add up to its total, in the model and in the printed table;
- the model follows the code's choices: more ranks give each a smaller peak, sliced exchanges
  hold smaller buffers, error feedback keeps residuals, precomputing keeps ``A X``;
- a tiny graph's measured peak (``fullgraph train`` in a subprocess) lies within a loose
  bracket of the prediction (the process floor dominates there);
- ``fullgraph train`` prints rank 0's prediction at start and warns when a node would not fit.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from fullgraph.cli import main as cli_main
from fullgraph.errors import ConfigError
from fullgraph.memory.model import (
    TERMS,
    GraphShape,
    PartShape,
    _replay,
    check_modelled,
    predict,
)
from fullgraph.partition import read_meta
from fullgraph.training.config import TrainConfig

MIB = 2**20
MODEL = ["--model", "sage", "--layers", "3", "--hidden", "32"]


def _plan(capsys, *args: str) -> tuple[int, str, str]:
    code = cli_main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    )


def test_missing_directory_is_one_line(capsys, tmp_path: Path) -> None:
    code, out, err = _plan(capsys, "--parts", str(tmp_path / "nope"), *MODEL, "--floor-mb", "1")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "does not exist" in err


def test_corrupted_part_file_is_refused_and_nothing_written(
    capsys, small_partitions, tmp_path: Path
) -> None:
    parts = tmp_path / "parts"
    shutil.copytree(small_partitions[2], parts)
    target = parts / "part-1" / "indices.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF  # same size, another checksum
    target.write_bytes(bytes(data))
    before = _listing(parts)
    code, out, err = _plan(capsys, "--parts", str(parts), *MODEL, "--floor-mb", "1")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "indices.npy fails its sha256 checksum" in err
    assert _listing(parts) == before


def test_gat_norm_and_residual_are_planned(capsys, small_partitions) -> None:
    parts = str(small_partitions[2])
    for extra in (
        ["--model", "gat", "--heads", "2"],
        ["--model", "sage", "--norm", "batch"],
        ["--model", "gcn", "--norm", "layer", "--residual"],
        ["--model", "gin", "--layers", "3"],
        ["--model", "graphconv", "--aggr", "mean"],
        ["--model", "sage", "--aggr", "max", "--norm", "layer"],
        ["--model", "graphconv", "--aggr", "max", "--residual"],
        ["--model", "mlp", "--layers", "3"],
        ["--model", "appnp", "--hops", "3", "--norm", "batch"],
    ):
        code, out, err = _plan(capsys, "--parts", parts, *extra, "--floor-mb", "1")
        assert code == 0 and err == "", extra
        assert out.count(": fits") == 1 and "peak in" in out, extra
    covered = r"covers --model gat, gcn, gin, mlp, .*appnp.*graphconv.*, not --model mine"
    with pytest.raises(ConfigError, match=covered):
        check_modelled(SimpleNamespace(model="mine"))  # a layer kind registered by a user


def test_norm_residual_and_gat_follow_the_code() -> None:
    floor = 300 * MIB
    shape = _shape(4)
    n, h = shape.parts[0].num_inner, shape.parts[0].num_halo
    plain = TrainConfig(model="gcn", layers=3, hidden=256, dropout=0.0, input_dropout=0.0)
    base = predict(shape, plain, floor)[0]
    # BatchNorm keeps each hidden layer's input (its output is the next layer's saved input)
    bn = predict(shape, replace(plain, norm="batch"), floor)[0]
    assert bn.terms["saved"] - base.terms["saved"] >= 4 * n * 256
    ln = predict(shape, replace(plain, norm="layer"), floor)[0]
    assert ln.total > base.total
    # a residual projection's weights are parameters too
    res = predict(shape, replace(plain, residual=True), floor)[0]
    assert res.terms["optimizer"] > base.terms["optimizer"]
    # GAT: the joined rows and the projections of the halo rows, never per-edge tensors
    gat = TrainConfig(model="gat", layers=2, hidden=16, heads=4, dropout=0.0, input_dropout=0.0)
    g = predict(shape, gat, floor)[0]
    assert g.total == sum(g.terms.values()) and g.terms["saved"] >= 4 * (n + h) * 4 * 18
    dense = predict(_shape(4, deg=80), gat, floor)[0]  # 4x the edges, same rows
    assert dense.terms["saved"] == g.terms["saved"]  # nothing per edge is kept
    assert dense.terms["structure"] > g.terms["structure"]
    more = predict(shape, replace(gat, heads=8), floor)[0]
    assert more.total > g.total
    # GIN: SAGE's body (input kept) plus the MLP's ReLU output saved per layer (all of them
    # live at the loss), and the MLP's second weights
    sage = TrainConfig(model="sage", layers=3, hidden=256, dropout=0.0, input_dropout=0.0)
    gin = replace(sage, model="gin")
    at_loss = [_replay(shape.parts[0], shape, c, floor).phase_peaks["loss"][1] for c in (sage, gin)]
    assert at_loss[1]["saved"] - at_loss[0]["saved"] == 4 * n * (2 * 256 + shape.num_classes)
    assert predict(shape, gin, floor)[0].total > predict(shape, sage, floor)[0].total


def test_max_layers_follow_the_code() -> None:
    """``--aggr max``: no operator values (the edges are kept instead), every layer keeps its
    maximum and its int32 argmax (``8 n d``), the input's halo rows arrive whole."""
    floor = 300 * MIB
    shape = _shape(4)
    n, h = shape.parts[0].num_inner, shape.parts[0].num_halo
    sage = TrainConfig(model="sage", layers=3, hidden=256, dropout=0.5, prune="off")
    top = replace(sage, aggr="max")
    at_loss = [_replay(shape.parts[0], shape, c, floor).phase_peaks["loss"][1] for c in (sage, top)]
    # both keep M_0 = A X_drop (F wide) and the hidden inputs h_1, h_2; the maximum also keeps
    # every argmax, M_1 and M_2, and the dropped input X_drop (not rebuilt: the root term's)
    widths = [shape.num_features, 256, 256]
    assert at_loss[1]["saved"] - at_loss[0]["saved"] == 8 * n * sum(widths)
    got = predict(shape, top, floor)[0]
    assert got.total == sum(got.terms.values()) and got.terms["halo"] >= 4 * h * 256
    assert predict(shape, replace(top, model="graphconv"), floor)[0].total == got.total


def test_a_node_too_small_prints_the_table_then_one_line(capsys, small_partitions) -> None:
    parts = str(small_partitions[4])
    args = ["--parts", parts, *MODEL, "--floor-mb", "300", "--ranks-per-node", "2"]
    code, out, err = _plan(capsys, *args, "--node-memory", "0.5")
    assert code == 2
    assert "node 0 (ranks 0-1)" in out and "node 1 (ranks 2-3)" in out and "does NOT fit" in out
    assert err.count("\n") == 1 and "does not fit: node" in err
    code, out, err = _plan(capsys, *args, "--node-memory", "64")
    assert code == 0 and err == "" and out.count(": fits") == 2


def test_table_terms_add_up_to_each_total(capsys, small_partitions) -> None:
    code, out, _ = _plan(capsys, "--parts", str(small_partitions[2]), *MODEL, "--floor-mb", "300")
    assert code == 0
    lines = out.splitlines()
    head = lines.index(next(ln for ln in lines if ln.strip().startswith("rank")))
    for line in lines[head + 1 : head + 3]:
        cells = line.split()
        terms = [float(c) for c in cells[4 : 4 + len(TERMS)]]
        total = float(cells[4 + len(TERMS)])
        assert abs(sum(terms) - total) <= len(TERMS), line  # each cell rounded to 1 MiB
        assert float(cells[4 + len(TERMS) - 1]) == 300  # the floor as given


def _shape(num_parts: int, n: int = 100_000, halo: float = 0.5, deg: int = 20) -> GraphShape:
    """A synthetic partition: ``n`` nodes split evenly, ``halo * n / P`` halo rows a part."""
    per = n // num_parts
    h = 0 if num_parts == 1 else int(halo * per)
    part = PartShape(0, per, h, deg * per, h, per // 10, deg * h // 4)
    return GraphShape("synthetic", num_parts, 100, 47, tuple([part] * num_parts))


def test_model_terms_add_up_and_follow_the_code() -> None:
    cfg = TrainConfig(model="sage", layers=3, hidden=256)
    floor = 300 * MIB
    one = predict(_shape(1), cfg, floor)[0]
    assert one.total == sum(one.terms.values()) and set(one.terms) == set(TERMS)
    assert one.terms["floor"] == floor and one.terms["halo"] == 0
    four, eight = predict(_shape(4), cfg, floor)[0], predict(_shape(8), cfg, floor)[0]
    graph_one, graph_four = one.total - floor, four.total - floor  # about 1/P, less the
    assert graph_four < 0.4 * graph_one and eight.total - floor < 0.6 * graph_four  # constants
    # a smaller exchange buffer: more slices, smaller buffers in flight
    big = TrainConfig(model="sage", layers=3, hidden=256, exchange_buffer_mb=4096)
    small = TrainConfig(model="sage", layers=3, hidden=256, exchange_buffer_mb=1)
    wide = _shape(4, n=2_000_000)
    assert predict(wide, small, floor)[0].terms["halo"] < predict(wide, big, floor)[0].terms["halo"]
    # error feedback keeps one residual per compressed exchange
    ef = TrainConfig(model="gcn", layers=2, hidden=64, compress_fwd="int8", error_feedback=True)
    assert predict(_shape(4), ef, floor)[0].terms["compression"] > 0
    plain = TrainConfig(model="gcn", layers=2, hidden=64)
    assert predict(_shape(4), plain, floor)[0].terms["compression"] == 0
    # no input dropout: the first aggregation is precomputed and kept with the features
    pre = TrainConfig(model="gcn", layers=2, hidden=64, input_dropout=0.0)
    n = _shape(4).parts[0].num_inner
    extra = predict(_shape(4), pre, floor)[0].terms["features"]
    assert extra - predict(_shape(4), plain, floor)[0].terms["features"] == 4 * n * 100


def test_bf16_mixed_follows_the_code() -> None:
    """``--precision bf16-mixed``: the kept aggregation ``M`` is bf16 (2 bytes), the forward
    halo rows too, the aggregation's sums float64 while they run."""
    floor = 300 * MIB
    shape = _shape(4)
    n = shape.parts[0].num_inner
    sage = TrainConfig(model="sage", layers=3, hidden=256, dropout=0.5, prune="off")
    mixed = replace(sage, precision="bf16-mixed")
    at_loss = [
        _replay(shape.parts[0], shape, c, floor).phase_peaks["loss"][1] for c in (sage, mixed)
    ]
    # the first layer aggregates first (100 -> 256) and keeps M_0 = A X_drop: half the bytes
    assert at_loss[0]["saved"] - at_loss[1]["saved"] == 2 * n * shape.num_features
    one = predict(shape, mixed, floor)[0]
    assert one.total == sum(one.terms.values())
    gin = replace(sage, model="gin")  # Lin2 keeps its bf16 input too
    at_loss = [
        _replay(shape.parts[0], shape, c, floor).phase_peaks["loss"][1]
        for c in (gin, replace(gin, precision="bf16-mixed"))
    ]
    widths = [shape.num_features, 256, 256]
    assert at_loss[1]["saved"] - at_loss[0]["saved"] == 2 * n * (256 + 256 + 47) - 2 * n * widths[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_tiny_graph_prediction_brackets_its_measured_peak(
    small_partitions, tmp_path: Path, precision: str
) -> None:
    """One process on a 1-part partition: ``fullgraph plan`` (floor measured in its own
    process), then ``fullgraph train``; peak RSS from ``getrusage(RUSAGE_CHILDREN)``."""
    from fullgraph.precision import bf16_unsupported

    if precision != "32" and bf16_unsupported("cpu") is not None:
        pytest.skip("this CPU has no bfloat16")
    parts = str(small_partitions[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    model = [
        "--model",
        "gcn",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--precision",
        precision,
        "--threads",
        "1",
    ]
    plan = subprocess.run(
        [sys.executable, "-m", "fullgraph.cli", "plan", "--parts", parts, *model[:-2]],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert plan.returncode == 0, plan.stderr
    row = next(ln for ln in plan.stdout.splitlines() if ln.strip().startswith("0 "))
    predicted = float(row.split()[4 + len(TERMS)])
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    train = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            sys.executable,
            "-m",
            "fullgraph.cli",
            "train",
            "--parts",
            parts,
            *model,
            "--epochs",
            "3",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert train.returncode == 0, train.stderr
    measured = int(train.stdout.split()[-1]) / 1024
    assert 0.7 * predicted <= measured <= 1.3 * predicted, (predicted, measured)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0


def test_train_prints_the_plan_and_refuses_a_node_that_would_not_fit(
    capsys, monkeypatch, small_partitions
) -> None:
    import fullgraph.memory.plan as plan_mod

    parts = str(small_partitions[1])
    args = ["train", "--parts", parts, "--model", "gcn", "--hidden", "16", "--epochs", "1"]
    assert cli_main(args) == 0
    out = capsys.readouterr()
    assert "memory plan: rank 0 peak" in out.out and "warning" not in out.err
    monkeypatch.setattr(plan_mod, "machine_memory_bytes", lambda: 1)
    assert cli_main([*args, "--quiet"]) == 2  # refused: one line, the override named
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert "error: memory plan: node 0 (rank 0) would need" in out.err
    assert "--memory-check warn to run anyway" in out.err
    assert cli_main([*args, "--quiet", "--memory-check", "warn"]) == 0
    out = capsys.readouterr()
    assert "memory plan: rank 0 peak" not in out.out
    assert "warning: memory plan: node 0 (rank 0) would need" in out.err
    monkeypatch.setattr(plan_mod, "measure_floor", _no_probe)
    assert cli_main([*args, "--memory-check", "off"]) == 0  # no prediction, no probe
    out = capsys.readouterr()
    assert "memory plan" not in out.out + out.err
    meta, _ = read_meta(parts)
    assert GraphShape.from_meta(meta).parts[0].num_inner == meta["parts"][0]["num_inner"]


def _no_probe(*args: object) -> int:
    raise AssertionError("the floor probe ran")


def _nothing_built(*args: object, **kwargs: object) -> None:
    raise AssertionError("the trainer was built")


#: Absurd sizes, each refused by the memory rule (no caps) with a node of 16 GiB.
ABSURD = {
    "width": ["--hidden", "10000000"],
    "heads": ["--model", "gat", "--heads", "100000"],
    "layers": ["--layers", "1000", "--hidden", "4096"],  # deeper is refused as such
}


@pytest.mark.parametrize("case", list(ABSURD))
@pytest.mark.parametrize("source", ["parts", "dataset"])
def test_absurd_sizes_are_refused_before_anything_is_allocated(
    capsys, monkeypatch, small_partitions, small_graph, tmp_path: Path, case: str, source: str
) -> None:
    """Neither the floor probe nor the trainer runs; one line within seconds, exit 2."""
    import fullgraph.memory.plan as plan_mod
    import fullgraph.training.trainer as trainer_mod
    from fullgraph.datasets.synthetic import write_ogb

    monkeypatch.setattr(plan_mod, "machine_memory_bytes", lambda: 16 * 2**30)
    monkeypatch.setattr(plan_mod, "measure_floor", _no_probe)
    monkeypatch.setattr(trainer_mod.Trainer, "__init__", _nothing_built)
    if source == "parts":
        data = ["--parts", str(small_partitions[1])]
    else:
        write_ogb(small_graph, tmp_path, "g")
        data = ["--dataset", "g", "--root", str(tmp_path)]
    t0 = time.monotonic()
    assert cli_main(["train", *data, *ABSURD[case], "--epochs", "1"]) == 2
    seconds = time.monotonic() - t0
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "Traceback" not in out.err, out.err
    assert "memory plan: node 0 (rank 0) would need" in out.err
    assert "more than this machine's 16.00 GiB" in out.err and "--memory-check" in out.err
    assert seconds < 20, seconds  # the prediction builds no tensor (a few seconds on CI)


def test_quick_prediction_of_a_deep_model_is_the_replay_or_just_below(monkeypatch) -> None:
    """Beyond REPLAYED_LAYERS the model is replayed at K-1 and K layers and extended."""
    import fullgraph.memory.model as mm

    monkeypatch.setattr(mm, "REPLAYED_LAYERS", 16)
    cora = GraphShape("cora-like", 1, 1433, 7, (PartShape(0, 2708, 0, 10556, 0, 140, 0),))
    configs = [
        TrainConfig(model="gcn", hidden=64),
        TrainConfig(model="sage", hidden=32, norm="batch"),
        TrainConfig(model="gcn", hidden=16, norm="layer", residual=True, input_dropout=0.0),
        TrainConfig(model="gat", hidden=8, heads=4),
        TrainConfig(model="sage", hidden=64, compress_fwd="int8", error_feedback=True),
    ]
    for shape in (_shape(1), _shape(4), cora):  # cora: the deep phases overtake at ~150
        for cfg in configs:
            for layers in (17, 60, 300):
                deep = replace(cfg, layers=layers)
                exact = predict(shape, deep, 300 * MIB)[0].total
                quick = mm.predict_quickly(shape, deep, 300 * MIB)[0]
                assert 0.99 * exact <= quick.total <= exact, (shape.dataset, cfg, layers)
                assert "extended to" in quick.phase


def test_minibatch_refuses_an_absurd_width(capsys, monkeypatch, small_graph, tmp_path) -> None:
    import fullgraph.memory.plan as plan_mod
    from fullgraph.datasets.synthetic import write_ogb

    monkeypatch.setattr(plan_mod, "machine_memory_bytes", lambda: 16 * 2**30)
    write_ogb(small_graph, tmp_path, "g")
    args = ["minibatch", "--dataset", "g", "--root", str(tmp_path), "--epochs", "1", "--quiet"]
    assert cli_main([*args, "--hidden", "10000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory plan: node 0 (rank 0) would need" in err
    assert "--hidden" in err and "--memory-check warn" in err
    assert cli_main([*args, "--hidden", "16"]) == 0


def test_node_memory_is_the_cgroup_limit_when_lower(tmp_path: Path) -> None:
    from fullgraph.resources import _cgroup_limits

    proc = tmp_path / "cgroup"
    v1 = tmp_path / "fs" / "memory" / "jobs" / "42"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1: no limit
    (v1.parent / "memory.limit_in_bytes").write_text(f"{8 * 2**30}\n")
    v2 = tmp_path / "fs" / "user.slice" / "job"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2.parent / "memory.max").write_text(f"{4 * 2**30}\n")
    proc.write_text("4:memory:/jobs/42\n1:cpu:/\n0::/user.slice/job\nnonsense\n")
    assert sorted(_cgroup_limits(str(proc), str(tmp_path / "fs"))) == [4 * 2**30, 8 * 2**30]
    assert _cgroup_limits(str(tmp_path / "missing"), str(tmp_path)) == []


def test_node_fits_counts_the_libraries_once() -> None:
    """The floor's file-backed part (the libraries' pages, one copy in the page cache) is
    counted once per node; a lone rank and ``shared=0`` count every rank's whole floor."""
    from fullgraph.memory.plan import node_fits, node_line

    cfg = TrainConfig(model="sage", layers=2, hidden=64)
    floor, shared = 300 * 2**20, 100 * 2**20
    preds = predict(_shape(4), cfg, floor)
    whole = sum(p.total for p in preds)
    (four,) = node_fits(preds, 4, 64 * 2**30, shared)
    assert four.need == whole - 3 * shared and four.shared == shared
    assert "the libraries' 100 MiB once" in node_line(four)
    assert node_fits(preds, 4, 64 * 2**30)[0].need == whole
    ones = node_fits(preds, 1, 64 * 2**30, shared)
    assert [nf.need for nf in ones] == [p.total for p in preds] and not ones[0].shared
    # never more than a rank's floor
    assert node_fits(preds, 4, 64 * 2**30, 10 * floor)[0].need == whole - 3 * floor
