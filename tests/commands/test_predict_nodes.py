"""``fullgraph predict --nodes``: some nodes' rows, and predicting on a receptive-field cut.

On the 600-node SBM graph with a 2-layer GCN (trained on the uncut graph):

- ``--nodes labelled`` and a list of splits write the rows of the ``all`` run at those ids,
  bit for bit, in ascending id, with ``node_ids.npy`` naming them; a file of ids (text or
  ``.npy``, shuffled) in the file's order; ``--nodes all`` writes no ``node_ids.npy``;
  ``--force`` replaces a prediction holding one; one process (``--dataset``) takes ``--nodes``;
- on a partition cut to the 2-hop field of the training nodes, ``--nodes labelled`` at P = 2
  (and a shuffled file of its seeds at P = 1) writes the uncut partition's rows at the same
  whole-graph ids bit for bit, ``node_ids.npy`` the whole graph's ids;
- refused in one line, exit 2, nothing written: ``all`` on a cut (default or given), a split
  the cut dropped, a file naming a node outside the cut's seeds (how many and the first), a
  repeated id, an id out of range, an empty or malformed file, an unknown split, no file,
  ``--nodes`` other than ``all`` with a link model;
- :class:`~fullgraph.training.inference.RowWriter` writes the selected rows only, at their
  output rows, window by window.

Enters through :mod:`fullgraph.commands.predict`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from file_tree import tree
from mp_utils import one_thread, run_mpi

from fullgraph.cli import main as cli_main
from fullgraph.datasets.graph import Graph
from fullgraph.errors import ConfigError, DataError
from fullgraph.partition import partition_graph
from fullgraph.partition.receptive_cut import CutSpec
from fullgraph.training.inference import RowWriter, create_files
from fullgraph.training.node_selection import check_request, parse_nodes, write_node_ids

FILES = ("logits.npy", "predictions.npy", "embeddings-1.npy")


def _run(argv: list[str], capsys=None) -> tuple[int, str]:
    with one_thread():
        code = cli_main([*argv, "--threads", "1"])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def _predict(argv: list[str]) -> None:
    assert _run(["predict", *argv, "--quiet"])[0] == 0


def _arrays(out: Path) -> dict[str, np.ndarray]:
    return {p.name: np.load(p) for p in sorted(out.glob("*.npy"))}


def _labelled(graph: Graph, *masks: str) -> np.ndarray:
    masks = masks or ("train_mask", "val_mask", "test_mask")
    return np.flatnonzero(np.logical_or.reduce([getattr(graph, m) for m in masks]))


@pytest.fixture(scope="module")
def setup(small_graph: Graph, small_partitions, tmp_path_factory) -> dict:
    """The model, the ``all`` run of the uncut 1-part partition, the cut partitions (P = 1, 2,
    2 hops of train) and ``small_graph`` as a dataset on disk."""
    from fullgraph.datasets.synthetic import write_ogb

    root = tmp_path_factory.mktemp("predict-nodes")
    model = root / "gcn.pt"
    one = str(small_partitions[1])
    train = ["train", "--parts", one, "--model", "gcn", "--layers", "2", "--hidden", "16"]
    assert _run([*train, "--epochs", "3", "--quiet", "--save-model", str(model)])[0] == 0
    ref = root / "all"
    _predict(
        ["--parts", one, "--model", str(model), "--logits", "--embeddings", "1", "--out", str(ref)]
    )
    cuts = {}
    for p in (1, 2):
        cuts[p] = root / f"cut-{p}"
        partition_graph(small_graph, p, cuts[p], seed=0, cut=CutSpec(2, ("train",)))
    write_ogb(small_graph, root / "data", small_graph.name)
    return {"model": model, "ref": _arrays(ref), "ref_dir": ref, "cuts": cuts, "root": root}


def _common(setup: dict) -> list[str]:
    return ["--model", str(setup["model"]), "--logits", "--embeddings", "1"]


def _same_rows(out: Path, setup: dict, ids: np.ndarray) -> None:
    """Every file of ``out`` holds the ``all`` run's rows at ``ids``, bit for bit."""
    got = _arrays(out)
    assert np.array_equal(got["node_ids.npy"], ids) and got["node_ids.npy"].dtype == np.int64
    for name in FILES:
        assert got[name].shape[0] == ids.size, name
        assert np.array_equal(got[name], setup["ref"][name][ids]), name


def test_labelled_and_splits_are_the_all_runs_rows(setup, small_graph, small_partitions, tmp_path):
    one = str(small_partitions[1])
    out = tmp_path / "labelled"
    _predict(["--parts", one, *_common(setup), "--nodes", "labelled", "--out", str(out)])
    ids = _labelled(small_graph)
    assert ids.size < small_graph.num_nodes  # some nodes are in no split
    _same_rows(out, setup, ids)
    record = json.loads((out / "predict.json").read_text())
    assert record["nodes"]["select"] == "splits" and record["nodes"]["rows"] == ids.size
    assert record["files"]["logits.npy"]["shape"] == [ids.size, 4]
    assert "--nodes labelled" in record["command"]
    splits = tmp_path / "splits"
    _predict(["--parts", one, *_common(setup), "--nodes", "test,train", "--out", str(splits)])
    _same_rows(splits, setup, _labelled(small_graph, "train_mask", "test_mask"))


def test_a_file_in_shuffled_order(setup, small_graph, small_partitions, tmp_path):
    ids = np.random.default_rng(1).permutation(small_graph.num_nodes)[:97]  # any nodes
    text = tmp_path / "ids.txt"
    text.write_text("# ids\n" + "\n".join(str(i) for i in ids) + "\n\n")
    out = tmp_path / "file"
    argv = ["--parts", str(small_partitions[1]), *_common(setup), "--out", str(out)]
    _predict([*argv, "--nodes", str(text)])
    _same_rows(out, setup, ids)
    np.save(tmp_path / "ids.npy", ids[::-1])  # --force over a prediction with node_ids.npy
    _predict([*argv, "--nodes", str(tmp_path / "ids.npy"), "--force"])
    _same_rows(out, setup, ids[::-1].copy())
    assert json.loads((out / "predict.json").read_text())["nodes"]["select"] == "file"


def test_all_writes_what_it_always_wrote(setup, small_partitions, tmp_path):
    out = tmp_path / "all"
    _predict(
        ["--parts", str(small_partitions[1]), *_common(setup), "--nodes", "all", "--out", str(out)]
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in setup["ref_dir"].iterdir())
    assert "node_ids.npy" not in names
    for name in FILES:
        assert (out / name).read_bytes() == (setup["ref_dir"] / name).read_bytes(), name


def test_one_process_takes_nodes(setup, small_graph, tmp_path):
    out = tmp_path / "one"
    data = ["--dataset", small_graph.name, "--root", str(setup["root"] / "data")]
    _predict([*data, *_common(setup), "--nodes", "val", "--out", str(out)])
    _same_rows(out, setup, _labelled(small_graph, "val_mask"))


@pytest.mark.timeout(240)
def test_a_cut_predicts_its_labelled_nodes_with_the_whole_graphs_bits(setup, small_graph, tmp_path):
    seeds = np.flatnonzero(small_graph.train_mask)
    out = tmp_path / "cut2"
    argv = ["-m", "fullgraph.cli", "predict", "--threads", "1", "--parts", str(setup["cuts"][2])]
    run_mpi(2, [*argv, *_common(setup), "--nodes", "labelled", "--quiet", "--out", str(out)], 200)
    _same_rows(out, setup, seeds)  # node_ids: the whole graph's ids, not the cut's
    record = json.loads((out / "predict.json").read_text())
    assert record["nodes"]["whole_graph"] and set(record["summary"]) == {"train_acc"}
    shuffled = np.random.default_rng(2).permutation(seeds)
    np.save(tmp_path / "seeds.npy", shuffled)
    one = tmp_path / "cut1"
    cut1 = ["--parts", str(setup["cuts"][1]), *_common(setup), "--out", str(one)]
    _predict([*cut1, "--nodes", str(tmp_path / "seeds.npy")])
    _same_rows(one, setup, shuffled)


def _refused(argv: list[str], capsys, out: Path, *needles: str) -> str:
    code, err = _run(["predict", *argv, "--out", str(out)], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists()
    return lines[0]


def test_a_cut_refuses_what_it_cannot_predict(setup, small_graph, capsys, tmp_path):
    cut = str(setup["cuts"][1])
    argv = ["--parts", cut, "--model", str(setup["model"])]
    out, before = tmp_path / "out", tree(setup["cuts"][1])
    seeds = int(small_graph.train_mask.sum())
    fix = ("--nodes labelled", "without --cut-hops", "2-hop receptive field of train")
    for given in ([], ["--nodes", "all"]):
        line = _refused([*argv, *given], capsys, out, *fix, f"its {seeds:,} labelled nodes")
    assert line.startswith(f"fullgraph predict: error: --parts {cut} is cut")
    _refused([*argv, "--nodes", "train,val"], capsys, out, "not val's", "--nodes train")
    outside = np.flatnonzero(~small_graph.train_mask)
    ids = np.concatenate([np.flatnonzero(small_graph.train_mask)[:5], outside[[7, 3]]])
    np.save(tmp_path / "ids.npy", ids)
    _refused(
        [*argv, "--nodes", str(tmp_path / "ids.npy")],
        capsys,
        out,
        "2 of its 7 ids name no labelled node of the cut",
        f"the first: node {outside[7]}, entry 5",
        "without --cut-hops",
    )
    assert tree(setup["cuts"][1]) == before


BAD_FILES = {
    "repeat.npy": (np.array([3, 5, 3]), "node 3 is given twice (entry 0 and entry 2)"),
    "range.npy": (np.array([3, 600, -1]), "node 600 (entry 1) is outside [0, 600)"),
    "empty.npy": (np.zeros(0, dtype=np.int64), "holds no node id"),
    "float.npy": (np.zeros(3), "expected integer node ids [m], got float64"),
    "pairs.npy": (np.zeros((3, 2), dtype=np.int64), "expected integer node ids [m]"),
    "bad.txt": ("1\n2\nx y\n", "line 3 ('x y') is not one node id"),
    "twice.txt": ("# a comment\n4\n\n4\n", "node 4 is given twice (line 2 and line 4)"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_file_is_one_line(name, setup, small_partitions, capsys, tmp_path):
    content, needle = BAD_FILES[name]
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        np.save(path, content)
    argv = ["--parts", str(small_partitions[1]), "--model", str(setup["model"])]
    _refused([*argv, "--nodes", str(path)], capsys, tmp_path / "out", f"--nodes {path}", needle)


def test_bad_specs_and_one_process_range(setup, small_graph, small_partitions, capsys, tmp_path):
    argv = ["--parts", str(small_partitions[1]), "--model", str(setup["model"])]
    out = tmp_path / "out"
    _refused([*argv, "--nodes", "train,tset"], capsys, out, "unknown split 'tset'")
    _refused([*argv, "--nodes", str(tmp_path / "none.npy")], capsys, out, "no such file")
    np.save(tmp_path / "far.npy", np.array([1, small_graph.num_nodes + 5]))
    data = ["--dataset", small_graph.name, "--root", str(setup["root"] / "data")]
    one = [*data, "--model", str(setup["model"]), "--nodes", str(tmp_path / "far.npy")]
    _refused(one, capsys, out, f"node {small_graph.num_nodes + 5} (entry 1) is outside")
    with pytest.raises(ConfigError, match="--nodes test applies to node models"):
        check_request(parse_nodes("test"), None, "--parts P", link=True)
    check_request(parse_nodes("all"), None, "--parts P", link=True)  # a link model's default


def test_the_writer_writes_the_selected_rows_window_by_window(tmp_path):
    rows = torch.arange(40, dtype=torch.float32).reshape(10, 4)  # this rank's 10 rows
    out = np.array([-1, 5, 0, -1, 6, 2, -1, 1, 4, 3])  # 7 of them written, in this order
    files = {"x.npy": ((7, 4), "float32")}
    create_files(tmp_path, files)
    writer = RowWriter(out, 7, window_bytes=2 * 16)  # two rows a window: four windows
    writer.write(tmp_path / "x.npy", rows)
    got = np.load(tmp_path / "x.npy")
    kept = np.flatnonzero(out >= 0)
    want = np.zeros((7, 4), dtype=np.float32)
    want[out[kept]] = rows.numpy()[kept]
    assert np.array_equal(got, want) and not (got == 0).all(axis=1).any()
    with pytest.raises(DataError, match="outside"):
        RowWriter(np.array([0, -2]), 7)


def test_node_ids_are_written_window_by_window(tmp_path):
    ids = np.random.default_rng(3).permutation(1000)[:37].astype(np.int64)
    create_files(tmp_path, {"node_ids.npy": ((37,), "int64")})
    write_node_ids(tmp_path / "node_ids.npy", ids, window_bytes=5 * 8)  # 8 windows
    assert np.array_equal(np.load(tmp_path / "node_ids.npy"), ids)
