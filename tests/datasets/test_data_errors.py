"""Bad input around datasets ends clean: one line, exit 2, nothing written or overwritten.

Classes of case: dataset names that are paths, roots and dataset directories that are not
there or not directories, unreadable files, overlapping splits, damaged Planetoid and MUSAE
files. (OGB files: ``test_ogb.py``; ``.npz`` files: ``test_npz_arrays.py``.)

Enters through :mod:`fullgraph.datasets.registry`.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from fullgraph.cli import main
from fullgraph.datasets import load
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.synthetic import write_ogb
from fullgraph.errors import DataError
from fullgraph.partition import partition_graph


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones too) with its bytes (``None`` for directories)."""
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


def cli_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """Run the command in-process; assert exit 2 and one stderr line; return that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fullgraph {argv[0]}: error: "), err
    assert "wrote" not in captured.out
    return err


@pytest.fixture(scope="module")
def tiny_graph(make_graph) -> Graph:
    return make_graph(num_nodes=80, num_features=3, num_classes=2, seed=3, name="tiny")


@pytest.mark.parametrize(
    "name", [".", "..", "../../x", "ABS", "a/b", "a\\b", "", ".hidden", "x y", "ünï"]
)
def test_dataset_name_must_be_plain(tmp_path: Path, tiny_graph: Graph, capsys, name: str) -> None:
    """`--name .` must not delete the root, `../x` or `/abs` must not write outside it."""
    root = tmp_path / "a" / "b" / "root"
    write_ogb(tiny_graph, root, "keep")
    name = str(tmp_path / "abs") if name == "ABS" else name
    before = tree(tmp_path)
    err = cli_error(
        capsys, ["data", "synth", "--name", name, "--root", str(root), "--force", "--seed", "1"]
    )
    assert f"dataset name {name!r}" in err or "dataset name is empty" in err
    assert "must be a plain name" in err or "give a plain name" in err
    assert tree(tmp_path) == before
    for argv in (
        ["data", "info", "--dataset", name, "--root", str(root)],
        ["partition", "--dataset", name, "--root", str(root), "--parts", "2"],
    ):
        out = ["--out", str(tmp_path / "parts")] if argv[0] == "partition" else []
        assert "plain name" in cli_error(capsys, argv + out)
    with pytest.raises(DataError, match="plain name"):
        load(name, root)
    with pytest.raises(DataError, match="plain name"):
        write_ogb(tiny_graph, root, name, force=True)
    assert tree(tmp_path) == before


def _file_root(tmp: Path) -> Path:
    (tmp / "f").write_text("not a directory\n")
    return tmp / "f"


def _no_raw(tmp: Path) -> Path:
    (tmp / "root" / "cora").mkdir(parents=True)
    return tmp / "root"


def _raw_is_file(tmp: Path) -> Path:
    (tmp / "root" / "tiny").mkdir(parents=True)
    (tmp / "root" / "tiny" / "meta.json").write_text("{}")
    (tmp / "root" / "tiny" / "raw").write_text("")
    return tmp / "root"


#: case -> (make the root under tmp, command, dataset, message)
LAYOUT_CASES: dict[str, tuple[Callable[[Path], Path], str, str, str]] = {
    "root-is-file-info": (_file_root, "info", "cora", r"dataset root .*/f is not a directory"),
    "root-is-file-partition": (
        _file_root,
        "partition",
        "ogbn-arxiv",
        r"dataset root .*/f is not a directory",
    ),
    "root-is-file-synth": (_file_root, "synth", "tiny", r"--root .*/f is a file"),
    "root-missing": (lambda t: t / "nowhere", "info", "cora", r"nowhere does not exist"),
    "no-raw-dir": (_no_raw, "info", "cora", r"root/cora/raw is missing; the dataset's files go"),
    "raw-is-file": (_raw_is_file, "info", "tiny", r"root/tiny/raw is not a directory"),
    "no-dataset-dir": (lambda t: t, "info", "amazon-photo", r"'amazon-photo' not found"),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_bad_root_or_layout(tmp_path: Path, capsys, case: str) -> None:
    make, command, dataset, message = LAYOUT_CASES[case]
    root = make(tmp_path)
    before = tree(tmp_path)
    if command == "info":
        argv = ["data", "info", "--dataset", dataset, "--root", str(root)]
    elif command == "synth":
        argv = ["data", "synth", "--name", dataset, "--root", str(root)]
    else:
        argv = ["partition", "--dataset", dataset, "--root", str(root), "--parts", "2"]
        argv += ["--out", str(tmp_path / "parts")]
    err = cli_error(capsys, argv)
    assert re.search(message, err), err
    assert tree(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
@pytest.mark.parametrize("rel", ["raw/edge.csv.gz", "raw/node-label.csv.gz", "meta.json", "raw"])
def test_unreadable_file(tmp_path: Path, tiny_graph: Graph, capsys, rel: str) -> None:
    d = write_ogb(tiny_graph, tmp_path, "tiny")
    (d / rel).chmod(0)
    try:
        err = cli_error(capsys, ["data", "info", "--dataset", "tiny", "--root", str(tmp_path)])
    finally:
        (d / rel).chmod(0o755)
    assert "tiny" in err


@pytest.mark.parametrize(
    ("a", "b"), [("train_mask", "val_mask"), ("train_mask", "test_mask"), ("val_mask", "test_mask")]
)
def test_overlapping_splits(tmp_path: Path, make_graph, capsys, a: str, b: str) -> None:
    """Graph.validate, the OGB reader (via `data info`) and `partition` refuse shared nodes."""
    g = make_graph(num_nodes=60, seed=5, name="lap")
    v = int(np.flatnonzero(getattr(g, a))[0])
    pair = f"the {a.removesuffix('_mask')} and the {b.removesuffix('_mask')} split"
    write_ogb(g, tmp_path / "data", "lap")
    getattr(g, b)[v] = True
    with pytest.raises(DataError, match=f"lap: node {v} is in both {pair}"):
        g.validate()
    with pytest.raises(DataError, match=f"node {v} is in both {pair}"):
        partition_graph(g, 2, tmp_path / "parts")
    assert not (tmp_path / "parts").exists()
    # the same on disk: add v to the other split file
    files = {"train_mask": "train", "val_mask": "valid", "test_mask": "test"}
    split = tmp_path / "data" / "lap" / "split" / "random"
    ids = np.flatnonzero(getattr(g, b))
    import gzip

    with gzip.open(split / f"{files[b]}.csv.gz", "wt") as f:
        f.write("\n".join(map(str, ids)) + "\n")
    err = cli_error(capsys, ["data", "info", "--dataset", "lap", "--root", str(tmp_path / "data")])
    assert f"node {v} is in both {files[a]}.csv.gz and {files[b]}.csv.gz" in err


# --- Planetoid --------------------------------------------------------------------------------

N_ALL, N_TEST, N_TRAIN, C, F = 510, 6, 4, 3, 5


def _pickle(path: Path, obj: object) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=4))


def write_planetoid(root: Path, name: str = "cora") -> Path:
    """Planetoid files for a ring of 516 nodes: 510 in allx/ally, 6 test nodes, 3 classes."""
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    onehot = np.eye(C, dtype=np.int64)
    ally = onehot[np.arange(N_ALL) % C]
    ty = onehot[np.arange(N_TEST) % C]
    allx = sp.csr_matrix(rng.random((N_ALL, F)).round(2).astype(np.float32))
    tx = sp.csr_matrix(rng.random((N_TEST, F)).round(2).astype(np.float32))
    n = N_ALL + N_TEST
    parts = {"x": allx[:N_TRAIN], "y": ally[:N_TRAIN], "allx": allx, "ally": ally}
    parts.update(tx=tx, ty=ty, graph={v: [(v + 1) % n, (v - 1) % n] for v in range(n)})
    for part, obj in parts.items():
        _pickle(raw / f"ind.{name}.{part}", obj)
    test_ids = N_ALL + np.array([3, 0, 5, 1, 4, 2])
    (raw / f"ind.{name}.test.index").write_text("\n".join(map(str, test_ids)) + "\n")
    return raw


def test_toy_planetoid_loads(tmp_path: Path) -> None:
    write_planetoid(tmp_path)
    g = load("cora", tmp_path)
    assert (g.num_nodes, g.num_classes, g.num_features) == (N_ALL + N_TEST, C, F)
    assert (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum())) == (4, 500, 6)


def _text(part: str, text: bytes) -> tuple[str, Callable[[Path], None]]:
    return part, lambda p: p.write_bytes(text)


PLANETOID_CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "truncated-pickle": ("ally", lambda p: p.write_bytes(p.read_bytes()[:40]), r"not a readable"),
    "text-pickle": (*_text("graph", b"hello\n"), r"not a readable Planetoid pickle"),
    "empty-pickle": (*_text("y", b""), r"not a readable Planetoid pickle"),
    "evil-pickle": (
        "tx",
        lambda p: p.write_bytes(b"cos\nsystem\n(S'true'\ntR."),
        r"refusing to load os\.system",
    ),
    "graph-not-dict": ("graph", lambda p: _pickle(p, [1, 2]), r"expected a dict of adjacency"),
    "graph-bad-ids": ("graph", lambda p: _pickle(p, {0: ["a"]}), r"expected a dict of node id"),
    "graph-id-range": ("graph", lambda p: _pickle(p, {0: [9999]}), r"endpoint 9999 out of range"),
    "labels-not-matrix": ("ty", lambda p: _pickle(p, {"a": 1}), r"expected a one-hot label"),
    "labels-1d": ("ally", lambda p: _pickle(p, np.zeros(N_ALL)), r"found shape \(510,\)"),
    "labels-not-onehot": ("ty", lambda p: _pickle(p, np.full((N_TEST, C), 7)), r"other than 0"),
    "labels-classes": ("ty", lambda p: _pickle(p, np.eye(4)[:N_TEST]), r"4 classes but"),
    "features-width": (
        "tx",
        lambda p: _pickle(p, sp.csr_matrix(np.ones((N_TEST, F + 1)))),
        r"6 feature columns but allx has 5",
    ),
    "features-nan": (
        "allx",
        lambda p: _pickle(p, np.full((N_ALL, F), np.nan)),
        r"holds NaN or infinite values",
    ),
    "features-rows": ("allx", lambda p: _pickle(p, np.ones((N_ALL - 1, F))), r"do not match"),
    "index-text": (*_text("test.index", b"510\nfive\n"), r"one integer node id per line"),
    "index-empty": (*_text("test.index", b""), r"the file is empty"),
    "index-twice": (*_text("test.index", b"510\n510\n511\n512\n513\n514\n"), r"twice"),
    "index-count": (*_text("test.index", b"510\n511\n"), r"2 test ids but 6 rows in ty"),
    "index-start": (*_text("test.index", b"1\n2\n3\n4\n5\n6\n"), r"test ids start at 1"),
    "train-too-long": (
        "y",
        lambda p: _pickle(p, np.eye(C, dtype=np.int64)[np.arange(20) % C]),
        r"20 training rows \+ 500 validation nodes exceed",
    ),
}


@pytest.mark.parametrize("case", list(PLANETOID_CASES))
def test_planetoid_bad_files(tmp_path: Path, capsys, case: str) -> None:
    part, edit, message = PLANETOID_CASES[case]
    raw = write_planetoid(tmp_path)
    edit(raw / f"ind.cora.{part}")
    err = cli_error(capsys, ["data", "info", "--dataset", "cora", "--root", str(tmp_path)])
    assert str(raw) in err, err
    assert re.search(message, err), err


# --- MUSAE ------------------------------------------------------------------------------------

MUSAE_N = 8


def write_musae(root: Path) -> Path:
    """Facebook-layout MUSAE files: a ring of 8 pages of 2 types, bag-of-words features."""
    raw = root / "facebook" / "raw"
    raw.mkdir(parents=True)
    ids = np.arange(MUSAE_N)
    rows = [f"{v},{1000 + v},page {v},{'tvshow' if v % 2 else 'company'}" for v in ids]
    (raw / "target.csv").write_text("id,facebook_id,page_name,page_type\n" + "\n".join(rows))
    edges = [f"{v},{(v + 1) % MUSAE_N}" for v in ids]
    (raw / "edges.csv").write_text("id_1,id_2\n" + "\n".join(edges) + "\n")
    (raw / "features.json").write_text(json.dumps({str(v): [int(v) % 3, 3] for v in ids}))
    return raw


def test_toy_musae_loads(tmp_path: Path) -> None:
    write_musae(tmp_path)
    g = load("facebook", tmp_path)
    assert (g.num_nodes, g.num_edges, g.num_classes, g.num_features) == (8, 16, 2, 4)


MUSAE_CASES: dict[str, tuple[str, bytes, str]] = {
    "edges-empty": ("edges.csv", b"", r"cannot parse as CSV with a header row: Empty CSV"),
    "edges-ragged": ("edges.csv", b"id_1,id_2\n0,1\n1,2,3\n", r"Expected 2 columns, got 3"),
    "edges-columns": ("edges.csv", b"a,b\n0,1\n", r"needs columns 'id_1' and 'id_2'"),
    "edges-text": ("edges.csv", b"id_1,id_2\n0,x\n", r"column 'id_2' must hold integer"),
    "edges-range": ("edges.csv", b"id_1,id_2\n0,8\n", r"edge 0 has endpoint 8 out of range"),
    "edges-binary": ("edges.csv", b"\xff\xfe\x00\x01\x02", r"edges\.csv: cannot parse"),
    "target-ids": ("target.csv", b"id,page_type\n0,a\n2,b\n", r"ids are not 0\.\.1"),
    "target-columns": ("target.csv", b"id,kind\n0,a\n", r"needs columns 'id' and 'page_type'"),
    "target-blank-label": ("target.csv", b"id,page_type\n0,a\n1,\n", r"has an empty value"),
    "features-not-json": ("features.json", b"{1: [", r"features\.json: not valid JSON"),
    "features-list": ("features.json", b"[1, 2]", r"expected a JSON object"),
    "features-ids": ("features.json", b'{"a": [1]}', r"expected a JSON object of node id"),
    "features-range": ("features.json", b'{"99": [1]}', r"node id 99 out of range"),
    "features-negative": ("features.json", b'{"1": [-2]}', r"a feature id is negative"),
    "features-values": ("features.json", b'{"1": ["x"]}', r"expected a JSON object of node id"),
}


@pytest.mark.parametrize("case", list(MUSAE_CASES))
def test_musae_bad_files(tmp_path: Path, capsys, case: str) -> None:
    name, content, message = MUSAE_CASES[case]
    raw = write_musae(tmp_path)
    (raw / name).write_bytes(content)
    err = cli_error(capsys, ["data", "info", "--dataset", "facebook", "--root", str(tmp_path)])
    assert str(raw / name) in err, err
    assert re.search(message, err), err


# --- graphs without edges ---------------------------------------------------------------------


def _edgeless(graph: Graph) -> Graph:
    """``graph`` with every edge removed (the nodes, features, labels and split kept)."""
    return Graph(
        name=graph.name,
        num_nodes=graph.num_nodes,
        indptr=np.zeros(graph.num_nodes + 1, dtype=np.int64),
        indices=np.zeros(0, dtype=np.int64),
        x=graph.x,
        y=graph.y,
        train_mask=graph.train_mask,
        val_mask=graph.val_mask,
        test_mask=graph.test_mask,
        num_classes=graph.num_classes,
    )


def _edgeless_planetoid(root: Path) -> None:
    raw = write_planetoid(root)
    _pickle(raw / "ind.cora.graph", {v: [] for v in range(N_ALL + N_TEST)})


def _edgeless_musae(root: Path) -> None:
    (write_musae(root) / "edges.csv").write_text("id_1,id_2\n")


#: reader -> (write an edgeless dataset under the root, its name, its node count)
EDGELESS: dict[str, tuple[Callable[[Path], None], str, int]] = {
    "ogb": (lambda r: write_ogb(_edgeless(_tiny()), r, "tiny"), "tiny", 80),
    "planetoid": (_edgeless_planetoid, "cora", N_ALL + N_TEST),
    "musae": (_edgeless_musae, "facebook", MUSAE_N),
}


def _tiny() -> Graph:
    from conftest import build_sbm_graph

    return build_sbm_graph(num_nodes=80, num_features=3, num_classes=2, seed=3, name="tiny")


@pytest.mark.parametrize("reader", list(EDGELESS))
def test_a_graph_without_edges_loads(tmp_path: Path, capsys, reader: str) -> None:
    """A graph with no edges is valid (``edge.csv.gz`` empty, ``edges.csv`` a header only)."""
    write, name, n = EDGELESS[reader]
    write(tmp_path)
    g = load(name, tmp_path)
    assert (g.num_nodes, g.num_edges) == (n, 0) and g.indptr.shape == (n + 1,)
    assert main(["data", "info", "--dataset", name, "--root", str(tmp_path)]) == 0
    assert "edges        0 directed" in capsys.readouterr().out


def test_an_edge_file_emptied_is_still_refused(tmp_path: Path, tiny_graph: Graph, capsys) -> None:
    """An empty edge file where num-edge-list counts edges is a damaged copy, as before."""
    import gzip

    d = write_ogb(tiny_graph, tmp_path, "tiny")
    with gzip.open(d / "raw" / "edge.csv.gz", "wb"):
        pass
    err = cli_error(capsys, ["data", "info", "--dataset", "tiny", "--root", str(tmp_path)])
    assert "edge.csv.gz: the file is empty; replace it with an intact copy" in err


def test_an_edgeless_graph_partitions_and_trains(tmp_path: Path, tiny_graph: Graph, capsys) -> None:
    """GCN on a graph without edges is a valid model (self-loops only): one process and parts."""
    write_ogb(_edgeless(tiny_graph), tmp_path / "data", "lonely")
    data = ["--dataset", "lonely", "--root", str(tmp_path / "data")]
    quiet = ["--epochs", "2", "--quiet", "--memory-check", "off"]
    for model in ("gcn", "sage", "gat"):
        assert main(["train", *data, "--model", model, *quiet]) == 0, capsys.readouterr().err
    parts = tmp_path / "parts"
    assert main(["partition", *data, "--parts", "1", "--out", str(parts)]) == 0
    assert main(["verify", str(parts)]) == 0
    assert main(["train", "--parts", str(parts), *quiet]) == 0
    assert "final: best val" in capsys.readouterr().out


# --- MUSAE under the directory names it is distributed with ------------------------------------


@pytest.mark.parametrize(
    ("directory", "names"),
    [
        ("facebook_page_page", ["facebook", "facebook_page_page", "facebook-page-page"]),
        ("facebook", ["facebook", "facebook_page_page"]),
    ],
)
def test_musae_loads_from_its_distributed_directory(
    tmp_path: Path, capsys, directory: str, names: list[str]
) -> None:
    raw = write_musae(tmp_path)
    if directory != "facebook":
        (tmp_path / "facebook").rename(tmp_path / directory)
    for name in names:
        g = load(name, tmp_path)
        assert g.name == "facebook" and (g.num_nodes, g.num_edges) == (8, 16)
        assert g.meta["path"] == str(tmp_path / directory / "raw"), name
    assert main(["data", "info", "--dataset", "facebook", "--root", str(tmp_path)]) == 0
    assert raw.name == "raw" and "facebook" in capsys.readouterr().out


def test_musae_missing_names_every_directory_tried(tmp_path: Path, capsys) -> None:
    err = cli_error(capsys, ["data", "info", "--dataset", "github", "--root", str(tmp_path)])
    assert f"{tmp_path / 'github'} or {tmp_path / 'github_musae'}" in err


def test_shared_musae_datasets_load_under_their_short_names() -> None:
    """The shared copies (``facebook_page_page/``, ``github_musae/``), read where they are."""
    from conftest import SHARED_DATASETS

    for name, directory, n in (
        ("facebook", "facebook_page_page", 22470),
        ("github", "github_musae", 37700),
    ):
        if not (SHARED_DATASETS / directory / "raw").is_dir():
            pytest.skip(f"{SHARED_DATASETS / directory} absent")
        assert load(name, SHARED_DATASETS).num_nodes == n


@pytest.mark.parametrize("value", ["nan", "inf", "1e308"])
@pytest.mark.parametrize("file", ["edge_weight.csv.gz", "edge_feat.csv.gz", "node-feat.csv.gz"])
def test_a_non_finite_value_names_its_own_file_and_line(
    tmp_path: Path, tiny_graph: Graph, capsys, file: str, value: str
) -> None:
    """Issue 31: the line named edge.csv.gz and num-node-list.csv.gz, not the damaged file."""
    import gzip

    from fullgraph.datasets.synthetic import with_edge_values

    write_ogb(with_edge_values(tiny_graph, edge_dim=2), tmp_path, "tiny")
    path = tmp_path / "tiny" / "raw" / file
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    lines[3] = ",".join([value] * len(lines[3].split(",")))
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    err = cli_error(capsys, ["data", "info", "--dataset", "tiny", "--root", str(tmp_path)])
    assert f"{file}: line 4 " in err and "num-node-list" not in err, err


def test_synth_refuses_edge_values_that_cannot_fit(tmp_path: Path, capsys) -> None:
    """Refused before anything is drawn, naming the size; no train levers (ranks)."""
    argv = ["data", "synth", "--name", "w", "--root", str(tmp_path), "--edge-dim", "100000000"]
    err = cli_error(capsys, argv)
    assert "GiB" in err and "--edge-dim" in err and "ranks" not in err, err
    assert not (tmp_path / "w").exists()


def test_a_name_starting_with_a_dash_is_refused(tmp_path: Path, capsys) -> None:
    err = cli_error(capsys, ["data", "synth", "--name=-x", "--root", str(tmp_path)])
    assert "does not start with '-'" in err and list(tmp_path.iterdir()) == []
