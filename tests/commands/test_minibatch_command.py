"""``fullgraph minibatch`` level with ``train``: start and memory-plan lines, progress within an
epoch, and a model file that ``predict`` and ``export`` read.

- the start line (``fullgraph minibatch: P rank(s), transport ...``) and rank 0's
  ``memory plan:`` line come before the first epoch; ``--quiet`` prints neither;
- ``--progress-every S`` prints ``epoch E: batch i/n`` lines within an epoch;
- ``--save-model`` (default ``<log stem>.model.pt`` beside ``--log-json``) writes
  ``train``'s model file: ``fullgraph predict`` on it gives the logits of the baseline's own
  layer-wise inference, and the scores of the best epoch; ``fullgraph export`` rebuilds it in
  PyG with the same logits;
- a ``--save-model`` onto a file fullgraph did not write as a model (a training log) is refused
  in one line, exit 2, the file unchanged.

Enters through :mod:`fullgraph.commands.minibatch`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mp_utils import one_thread

from fullgraph.cli import main as cli_main
from fullgraph.datasets import load, to_pyg
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.distributed.communicator import Communicator
from fullgraph.minibatch.inference import RowOperator, layerwise_inference
from fullgraph.training.model_file import load_model_file

NAME = "synth-tiny"
RUN = ["--fanouts", "4,4", "--batch-size", "256", "--hidden", "16", "--epochs", "3"]


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with one_thread():
        code = cli_main([*argv, "--threads", "1"] if argv[0] != "export" else argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fullgraph.datasets.synthetic import generate

    root = tmp_path_factory.mktemp("minibatch-command")
    write_ogb(generate("tiny", seed=1), root, NAME)
    return root


def _exported_logits(module_path: Path, graph) -> torch.Tensor:
    """The logits of the model ``fullgraph export`` wrote, imported from its module."""
    spec = importlib.util.spec_from_file_location(f"exported_{module_path.stem}", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, data = module.load_model().eval(), to_pyg(graph)
    return model(data.x, data.edge_index)


@pytest.fixture(scope="module")
def trained(root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run with a log, its default model file and a progress line after every batch."""
    out = tmp_path_factory.mktemp("minibatch-run")
    log = out / "run.jsonl"
    argv = ["minibatch", "--dataset", NAME, "--root", str(root), *RUN]
    argv += ["--log-json", str(log), "--progress-every", "1e-9", "--threads", "1"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with one_thread(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli_main(argv)
    assert code == 0, stderr.getvalue()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return {
        "out": stdout.getvalue(),
        "err": stderr.getvalue(),
        "log": log,
        "model": out / "run.model.pt",
        "records": records,
    }


def test_start_and_memory_plan_lines_come_before_the_first_epoch(trained: dict) -> None:
    lines = trained["out"].splitlines()
    assert lines[0].startswith("fullgraph minibatch: 1 rank(s), transport local, 1 thread(s)/rank")
    assert "model sage L=2 H=16, fanouts 4,4, batch size 256" in lines[0]
    assert "epochs 1..3, metric acc, precision 32" in lines[0]
    assert re.match(r"memory plan: rank 0 peak \d+ MiB in evaluation \(.*process floor", lines[1])
    first_epoch = next(i for i, line in enumerate(lines) if line.startswith("epoch    1 |"))
    assert first_epoch > 1


def test_progress_lines_within_every_epoch(trained: dict) -> None:
    steps = trained["records"][0]["steps"]
    assert steps > 1
    for epoch in (1, 2, 3):
        got = re.findall(rf"^epoch +{epoch}: batch (\d+)/(\d+), ", trained["out"], re.M)
        # one after every batch but the last (the epoch line follows it)
        assert [int(d) for d, _ in got] == list(range(1, steps)), got
        assert {int(n) for _, n in got} == {steps}


def test_quiet_prints_no_start_plan_or_progress_line(root: Path, tmp_path: Path, capsys) -> None:
    argv = ["minibatch", "--dataset", NAME, "--root", str(root), *RUN, "--epochs", "1"]
    code, out, err = _cli([*argv, "--quiet", "--progress-every", "1e-9"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith("final: ") and len(out.splitlines()) == 1


def test_predict_on_the_model_file_gives_the_layerwise_logits(
    trained: dict, root: Path, tmp_path: Path, capsys
) -> None:
    model = trained["model"]
    assert (
        f"model (best validation, epoch {trained['records'][-1]['best_epoch']}): {model}"
        in (trained["out"])
    )
    mf = load_model_file(model)
    assert mf.config.model == "sage" and mf.config.layers == 2 and mf.config.hidden == 16
    assert mf.config.extra["fanouts"] == [4, 4] and mf.info["data"] == NAME
    out = tmp_path / "preds"
    argv = ["predict", "--dataset", NAME, "--root", str(root), "--model", str(model)]
    code, printed, err = _cli([*argv, "--out", str(out), "--logits"], capsys)
    assert code == 0, err
    graph = load(NAME, root)
    with one_thread(), torch.no_grad():
        ops = RowOperator.of(graph.indptr, graph.indices, 0, graph.num_nodes)
        want = layerwise_inference(mf.build(), ops, graph.x, Communicator()).numpy()
    got = np.load(out / "logits.npy")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.array_equal(got.argmax(1), want.argmax(1))
    best = next(r for r in trained["records"] if r.get("epoch") == mf.info["epoch"])
    summary = json.loads((out / "predict.json").read_text())["summary"]
    for split in ("train", "val", "test"):
        assert summary[f"{split}_acc"] == pytest.approx(best[f"{split}_acc"], abs=1e-6)


def test_export_rebuilds_the_model_in_pyg(trained: dict, root: Path, tmp_path: Path, capsys):
    out = tmp_path / "export" / "baseline.py"
    code, printed, err = _cli(["export", "--model", str(trained["model"]), str(out)], capsys)
    assert code == 0, err
    graph = load(NAME, root)
    mf = load_model_file(trained["model"])
    with one_thread(), torch.no_grad():
        ops = RowOperator.of(graph.indptr, graph.indices, 0, graph.num_nodes)
        ours = layerwise_inference(mf.build(), ops, graph.x, Communicator())
        theirs = _exported_logits(out, graph)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)


def test_save_model_onto_a_training_log_is_refused(trained: dict, root: Path, capsys) -> None:
    log = trained["log"]
    before = log.read_bytes()
    argv = ["minibatch", "--dataset", NAME, "--root", str(root), *RUN, "--epochs", "1"]
    for force in ([], ["--force"]):
        code, out, err = _cli([*argv, "--save-model", str(log), *force], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "--save-model" in lines[0], err
        assert "Traceback" not in err and out == ""
        assert log.read_bytes() == before
