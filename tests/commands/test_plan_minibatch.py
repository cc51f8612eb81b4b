"""``fullgraph plan minibatch`` and ``fullgraph plan --dataset``: runs that read no partition.

- ``plan minibatch`` prints one row per rank, each total the estimate the run itself checks
  (:func:`~fullgraph.memory.minibatch.predict_minibatch`), the graph's arrays counted once per
  node; a node that does not fit ends it with one line, exit 2; the run's own options before
  ``minibatch``, bad fanouts or a missing dataset are one line, exit 2;
- ``plan --dataset`` plans the one process of ``fullgraph train --dataset``: the prediction of
  the whole graph's shape, as the run's memory plan makes it;
- nothing is written under the dataset (once the loader's own cache is there).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from file_tree import tree

from fullgraph.cli import main as cli_main
from fullgraph.datasets import load
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.memory.minibatch import predict_minibatch
from fullgraph.memory.model import GraphShape, predict_quickly
from fullgraph.memory.plan import MIB, mib
from fullgraph.minibatch.config import MinibatchConfig
from fullgraph.partition import whole_graph_part
from fullgraph.training.config import TrainConfig

NAME = "synth-tiny"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fullgraph.datasets.synthetic import generate

    root = tmp_path_factory.mktemp("plan-data")
    write_ogb(generate("tiny", seed=1), root, NAME)
    load(NAME, root)  # the loader's processed/ cache, which any first read writes
    return root


def _plan(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = cli_main(["plan", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_minibatch_gives_every_rank_the_runs_own_estimate(capsys, root: Path) -> None:
    before = tree(root)
    run = ["--fanouts", "5,5", "--hidden", "64", "--batch-size", "128"]
    code, out, err = _plan(
        capsys,
        "minibatch",
        "--dataset",
        NAME,
        "--root",
        str(root),
        "--ranks",
        "3",
        "--ranks-per-node",
        "2",
        "--floor-mb",
        "100",
        *run,
        "--epochs",
        "7",
        "--lr",
        "0.01",
    )
    assert code == 0 and err == "", err
    assert out.startswith(f"fullgraph plan minibatch: {NAME}, 3 rank(s)")
    assert "model sage L=2 H=64, fanouts 5,5, batch size 128" in out
    graph = load(NAME, root)
    cfg = MinibatchConfig(fanouts=[5, 5], hidden=64, batch_size=128)
    want = predict_minibatch(
        graph.num_nodes,
        graph.num_edges,
        graph.num_features,
        graph.num_classes,
        cfg,
        3,
        2,
        100 * MIB,
    )
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s", line)]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert [r[2] for r in rows] == ["yes", "shared", "yes"]  # the graph once per node
    assert [p.phase for p in want] == ["evaluation"] * 3
    assert [r[-2] for r in rows] == [mib(p.total) for p in want]
    assert re.search(r"^node 0 \(ranks 0-1\): .* fits$", out, re.M)
    assert re.search(r"^node 1 \(rank 2\): .* fits$", out, re.M)
    assert tree(root) == before


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hidden", "64", "minibatch"], "--hidden given before `minibatch`"),
        (["minibatch", "--fanouts", "5,x"], "--fanouts must be comma-separated integers"),
        (["minibatch", "--ranks", "0"], "--ranks"),
        (["minibatch", "--node-memory", "0.01", "--floor-mb", "1"], "does not fit: node 0"),
    ],
)
def test_plan_minibatch_bad_input_is_one_line(capsys, root: Path, args, needle) -> None:
    data = ["--dataset", NAME, "--root", str(root)]
    argv = [*args, *data] if args[-1] == "minibatch" else [args[0], *data, *args[1:]]
    code, out, err = _plan(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_plan_minibatch_of_a_missing_dataset_is_one_line(capsys, tmp_path: Path) -> None:
    code, out, err = _plan(capsys, "minibatch", "--dataset", NAME, "--root", str(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1, err


def test_plan_dataset_plans_the_one_process_run(capsys, root: Path) -> None:
    before = tree(root)
    model = ["--model", "sage", "--layers", "2", "--hidden", "32"]
    code, out, err = _plan(
        capsys, "--dataset", NAME, "--root", str(root), *model, "--floor-mb", "50"
    )
    assert code == 0 and err == "", err
    assert f"1 part(s) (the whole graph in one process, --dataset {NAME} --root {root})" in out
    cfg = TrainConfig(model="sage", layers=2, hidden=32)
    shape = GraphShape.from_part(whole_graph_part(load(NAME, root)), NAME)
    (want,) = predict_quickly(shape, cfg, 50 * MIB)
    line = next(line for line in out.splitlines() if re.match(r"\s+0\s", line))
    row = line.split()
    assert row[1:4] == [str(shape.parts[0].num_inner), "0", str(shape.parts[0].num_edges)]
    assert line.endswith(f" {mib(want.total)}  {want.phase}"), (line, want)
    assert tree(root) == before


def test_plan_needs_one_source(capsys, root: Path) -> None:
    code, out, err = _plan(capsys, "--model", "sage")
    assert code == 2 and err.count("\n") == 1 and "--dataset NAME --root DIR" in err
    code, out, err = _plan(capsys, "--dataset", NAME, "--model", "sage")
    assert code == 2 and err.count("\n") == 1 and "--dataset needs --root" in err
