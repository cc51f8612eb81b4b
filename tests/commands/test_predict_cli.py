"""``fullgraph predict``'s bad input and its output directory.

Each refusal is one line on stderr, exit status 2, and nothing is written (the trees under the
inputs and the output's parent are unchanged): a model file whose feature or class count is
not the data's (both numbers named), a corrupted or truncated model file, ``--embeddings``
beyond the layers or 0, an existing ``--out`` without ``--force`` (and ``--force`` on a
directory fullgraph did not write), a rank count that is not the part count, outputs that
overlap an input. ``--force`` replaces a prediction fullgraph wrote.

Enters through :mod:`fullgraph.commands.predict`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from file_tree import tree
from mp_utils import one_thread

from fullgraph.cli import main as cli_main
from fullgraph.training.inference import PREDICTION


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    with one_thread():
        try:
            code = cli_main([*argv, "--threads", "1"])
        except SystemExit as exc:  # argparse's own one-line errors (a required option)
            code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(argv: list[str], capsys, needle: str, *watched: Path) -> str:
    """Run ``argv``; assert one line with ``needle``, exit 2 and no change under ``watched``."""
    before = tree(*watched)
    code, out, err = _run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], (needle, lines[0])
    assert out == ""
    assert tree(*watched) == before
    return lines[0]


@pytest.fixture(scope="module")
def model(small_partitions, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer sage model trained on ``small_graph`` (12 features, 4 classes)."""
    path = tmp_path_factory.mktemp("predict-model") / "m.pt"
    argv = ["train", "--parts", str(small_partitions[1]), "--model", "sage", "--epochs", "3"]
    with one_thread():
        assert cli_main([*argv, "--quiet", "--threads", "1", "--save-model", str(path)]) == 0
    return path


def test_a_model_of_other_widths_is_refused_naming_both(
    model: Path, make_graph, tmp_path: Path, capsys
) -> None:
    from fullgraph.datasets import load
    from fullgraph.datasets.synthetic import write_ogb
    from fullgraph.partition import partition_graph

    other = make_graph(num_nodes=200, num_features=8, name="narrow")
    parts = tmp_path / "narrow-1"
    partition_graph(other, 1, parts, method="contiguous")
    out = tmp_path / "out"
    line = _refused(
        ["predict", "--parts", str(parts), "--model", str(model), "--out", str(out)],
        capsys,
        "was trained on 12 features and 4 classes",
        tmp_path,
    )
    assert f"--parts {parts} has 8 features and 4 classes" in line
    root = tmp_path / "data"
    write_ogb(make_graph(num_nodes=200, num_classes=3, name="few"), root, "few")
    load("few", root)  # the reader's own cache of the edges, made on a first load
    data = ["--dataset", "few", "--root", str(root)]
    line = _refused(
        ["predict", *data, "--model", str(model), "--out", str(out)],
        capsys,
        "has 12 features and 3 classes",
        tmp_path,
    )
    assert "trained on 12 features and 4 classes" in line


def test_damaged_model_files_are_refused(
    model: Path, small_partitions, tmp_path: Path, capsys
) -> None:
    data = model.read_bytes()
    cut, flipped = tmp_path / "cut.pt", tmp_path / "flipped.pt"
    cut.write_bytes(data[: len(data) // 2])
    bad = bytearray(data)
    bad[len(bad) // 3] ^= 1
    flipped.write_bytes(bytes(bad))
    parts, out = str(small_partitions[1]), str(tmp_path / "out")
    for path, needle in (
        (cut, "not a fullgraph model file"),
        (flipped, "sha256 checksum"),
        (tmp_path / "none.pt", "none.pt"),
    ):
        _refused(
            ["predict", "--parts", parts, "--model", str(path), "--out", out],
            capsys,
            needle,
            tmp_path,
            small_partitions[1],
        )


def test_embeddings_beyond_the_layers_are_refused(
    model: Path, small_partitions, tmp_path: Path, capsys
) -> None:
    common = ["predict", "--parts", str(small_partitions[1]), "--model", str(model)]
    common += ["--out", str(tmp_path / "out")]
    cases = {
        "2": "the model has 2 layers; layer k's embeddings exist for k in 1..1",
        "0": "--embeddings 0:",
        "1,3": "--embeddings 3:",
        "x": "--embeddings must be comma-separated layer numbers",
    }
    for layers, needle in cases.items():
        _refused([*common, "--embeddings", layers], capsys, needle, tmp_path)


def test_outputs_are_replaced_only_with_force_and_only_ours(
    model: Path, small_partitions, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    common = ["predict", "--parts", str(small_partitions[1]), "--model", str(model), "--quiet"]
    code, stdout, err = _run([*common, "--out", str(out)], capsys)
    assert code == 0, err
    assert "predicted 600 nodes" in stdout and "layer 1/2" not in stdout  # --quiet
    assert PREDICTION.foreign(out) is None
    assert sorted(p.name for p in out.iterdir()) == [
        "predict.json",
        "predictions.npy",
        "probabilities.npy",
    ]
    _refused([*common, "--out", str(out)], capsys, "already exists (use --force", tmp_path)
    code, _, err = _run([*common, "--out", str(out), "--force", "--logits"], capsys)
    assert code == 0, err
    assert (out / "logits.npy").is_file() and not (out / "probabilities.npy").exists()
    assert json.loads((out / "predict.json").read_text())["files"]["logits.npy"]["shape"] == [
        600,
        4,
    ]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary directory left behind
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("a user's own file")
    foreign = "is not a prediction written by fullgraph (it holds thesis.tex)"
    _refused([*common, "--out", str(mine), "--force"], capsys, foreign, tmp_path)
    ours_plus = tmp_path / "ours-plus"
    shutil.copytree(out, ours_plus)
    (ours_plus / "notes.txt").write_text("added by hand")
    _refused([*common, "--out", str(ours_plus), "--force"], capsys, "it holds notes.txt", tmp_path)


def test_rank_count_and_overlapping_outputs_are_refused(
    model: Path, small_partitions, small_graph, tmp_path: Path, capsys
) -> None:
    from fullgraph.datasets import load
    from fullgraph.datasets.synthetic import write_ogb

    parts = small_partitions[2]
    common = ["predict", "--model", str(model)]
    _refused(
        [*common, "--parts", str(parts), "--out", str(tmp_path / "o")],
        capsys,
        "has 2 parts but 1 ranks were started",
        tmp_path,
        parts,
    )
    one = small_partitions[1]
    for out, needle in (
        (one / "preds", "is inside the partition this command reads"),
        (model, "is the model file this command reads"),
        (model.parent, "holds the model file this command reads"),
    ):
        _refused(
            [*common, "--parts", str(one), "--out", str(out)], capsys, needle, one, model.parent
        )
    root = tmp_path / "data"
    write_ogb(small_graph, root, "sbm")
    load("sbm", root)  # the reader's own cache of the edges, made on a first load
    data = ["--dataset", "sbm", "--root", str(root)]
    _refused(
        [*common, *data, "--out", str(root / "sbm" / "p")],
        capsys,
        "is inside the dataset directory this command reads",
        root,
    )
    _refused(
        ["predict", *data, "--out", str(tmp_path / "o")],
        capsys,
        "the following arguments are required: --model",
        tmp_path,
    )
    _refused([*common, *data], capsys, "the following arguments are required: --out", tmp_path)


def test_written_files_open_memory_mapped(
    model: Path, small_partitions, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    argv = ["predict", "--parts", str(small_partitions[1]), "--model", str(model)]
    code, stdout, err = _run([*argv, "--out", str(out), "--embeddings", "1"], capsys)
    assert code == 0, err
    assert "layer 1/2:" in stdout and "layer 2/2:" in stdout
    probs = np.load(out / "probabilities.npy", mmap_mode="r")
    emb = np.load(out / "embeddings-1.npy", mmap_mode="r")
    pred = np.load(out / "predictions.npy", mmap_mode="r")
    assert isinstance(probs, np.memmap) and probs.dtype == np.float32 and probs.shape == (600, 4)
    assert emb.shape == (600, 16) and (np.asarray(emb) >= 0).all()  # after the ReLU
    np.testing.assert_array_equal(pred, np.asarray(probs).argmax(axis=1))
    record = json.loads((out / "predict.json").read_text())
    assert record["format"] == "fullgraph-predict" and record["data"]["num_nodes"] == 600
    assert record["embeddings"] == {"1": "output of layer 1 as layer 2 receives it"}
