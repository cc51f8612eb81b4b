"""OGB-layout reader on small hand-written directories; bad input gives specific DataErrors."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fullgraph.datasets import load
from fullgraph.errors import DataError

# Directed edges with a duplicate (0->1 twice), a self-loop (2->2) and a reverse pair (3<->4).
EDGES = [(0, 1), (0, 1), (1, 2), (2, 2), (3, 4), (4, 3), (5, 0)]
N = 6
FEATS = np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4
LABELS = ["0", "1", "nan", "1", "0", "nan"]


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def write_ogb_dir(root: Path, name: str = "ogbn-toy", scheme: str = "time") -> Path:
    """A tiny OGB node-property dataset laid out exactly as OGB ships it."""
    d = root / name.replace("-", "_")
    _gz(d / "raw" / "edge.csv.gz", [f"{u},{v}" for u, v in EDGES])
    _gz(d / "raw" / "node-feat.csv.gz", [",".join(f"{v:g}" for v in row) for row in FEATS])
    _gz(d / "raw" / "node-label.csv.gz", LABELS)
    _gz(d / "raw" / "num-node-list.csv.gz", [str(N)])
    _gz(d / "raw" / "num-edge-list.csv.gz", [str(len(EDGES))])
    _gz(d / "split" / scheme / "train.csv.gz", ["0", "1"])
    _gz(d / "split" / scheme / "valid.csv.gz", ["3"])
    _gz(d / "split" / scheme / "test.csv.gz", ["4"])
    return d


def edge_set(g) -> set[tuple[int, int]]:
    dst = np.repeat(np.arange(g.num_nodes), g.in_degree())
    return set(zip(g.indices.tolist(), dst.tolist(), strict=True))


def test_directed_and_symmetrised(tmp_path: Path) -> None:
    write_ogb_dir(tmp_path)
    directed = load("ogbn-toy", tmp_path, symmetric=False, cache=False)
    assert edge_set(directed) == {(0, 1), (1, 2), (3, 4), (4, 3), (5, 0)}
    sym = load("ogbn-toy", tmp_path, cache=False)
    assert edge_set(sym) == {(0, 1), (1, 0), (1, 2), (2, 1), (3, 4), (4, 3), (5, 0), (0, 5)}
    loops = load("ogbn-toy", tmp_path, symmetric=False, remove_self_loops=False, cache=False)
    assert (2, 2) in edge_set(loops)
    np.testing.assert_array_equal(sym.x, FEATS)
    np.testing.assert_array_equal(sym.y, [0, 1, -1, 1, 0, -1])  # NaN labels -> -1
    assert sym.num_classes == 2
    assert sym.train_mask.tolist() == [True, True, False, False, False, False]
    assert np.flatnonzero(sym.val_mask).tolist() == [3]
    assert np.flatnonzero(sym.test_mask).tolist() == [4]


def test_cache_written_reused_and_invalidated(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    first = load("ogbn-toy", tmp_path)
    cache = d / "processed" / "sym"
    assert (cache / "indices.npy").is_file() and (cache / "key.json").is_file()
    mapped = load("ogbn-toy", tmp_path, mmap=True)
    assert isinstance(mapped.indices, np.memmap)
    np.testing.assert_array_equal(mapped.indices, first.indices)
    # Changing a raw file invalidates the cache: the new edge shows up.
    _gz(d / "raw" / "edge.csv.gz", [f"{u},{v}" for u, v in [*EDGES, (2, 3)]])
    _gz(d / "raw" / "num-edge-list.csv.gz", [str(len(EDGES) + 1)])
    os.utime(d / "raw" / "edge.csv.gz", ns=(1, 1))  # mtime differs even on coarse clocks
    again = load("ogbn-toy", tmp_path)
    assert (2, 3) in edge_set(again) and (2, 3) not in edge_set(first)


def test_several_schemes_pick_known_one(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path, scheme="time")
    _gz(d / "split" / "other" / "train.csv.gz", ["5"])
    g = load("ogbn-toy", tmp_path, cache=False)
    assert np.flatnonzero(g.train_mask).tolist() == [0, 1]


@pytest.mark.parametrize(
    "raw_file", ["edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz", "num-node-list.csv.gz"]
)
def test_missing_file_names_path(tmp_path: Path, raw_file: str) -> None:
    d = write_ogb_dir(tmp_path)
    (d / "raw" / raw_file).unlink()
    with pytest.raises(DataError, match=f"missing file: expected .*raw/{raw_file}"):
        load("ogbn-toy", tmp_path, cache=False)


def test_missing_split_file_names_path(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    (d / "split" / "time" / "valid.csv.gz").unlink()
    with pytest.raises(DataError, match=r"expected .*split/time/valid\.csv\.gz"):
        load("ogbn-toy", tmp_path, cache=False)


def test_missing_dataset_dir(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"not found: expected directory .*ogbn_nothing"):
        load("ogbn-nothing", tmp_path)


def test_out_of_range_edge(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    _gz(d / "raw" / "edge.csv.gz", ["0,1", "1,99"])
    _gz(d / "raw" / "num-edge-list.csv.gz", ["2"])
    with pytest.raises(DataError, match=r"edge 1 has endpoint 99 out of range \[0, 6\)"):
        load("ogbn-toy", tmp_path, cache=False)


def test_edge_count_mismatch(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    _gz(d / "raw" / "num-edge-list.csv.gz", ["100"])
    with pytest.raises(DataError, match="7 edges but num-edge-list says 100"):
        load("ogbn-toy", tmp_path, cache=False)


def test_label_length_mismatch(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    _gz(d / "raw" / "node-label.csv.gz", LABELS[:-2])
    with pytest.raises(DataError, match="4 labels but 6 nodes"):
        load("ogbn-toy", tmp_path, cache=False)


def test_feature_length_mismatch(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    _gz(d / "raw" / "node-feat.csv.gz", ["1,2,3"] * 5)
    with pytest.raises(DataError, match="5 feature rows but 6 nodes"):
        load("ogbn-toy", tmp_path, cache=False)


def test_nan_features(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    rows = [",".join(f"{v:g}" for v in row) for row in FEATS]
    rows[4] = "1,nan,3"
    _gz(d / "raw" / "node-feat.csv.gz", rows)
    with pytest.raises(DataError, match=r"node-feat.csv.gz: line 5 \(node 4\) holds a value"):
        load("ogbn-toy", tmp_path, cache=False)


def test_split_id_out_of_range(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    _gz(d / "split" / "time" / "test.csv.gz", ["4", "6"])
    with pytest.raises(DataError, match=r"test\.csv\.gz: node id 6 out of range"):
        load("ogbn-toy", tmp_path, cache=False)


def test_non_numeric_file(tmp_path: Path) -> None:
    d = write_ogb_dir(tmp_path)
    _gz(d / "raw" / "edge.csv.gz", ["0,1", "a,b"])
    with pytest.raises(DataError, match="edge.csv.gz: cannot parse"):
        load("ogbn-toy", tmp_path, cache=False)


def test_unknown_name_lists_known(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'nope'; known: cora, citeseer"):
        load("nope", tmp_path)


def test_cli_error_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fullgraph.cli",
            "data",
            "info",
            "--dataset",
            "nope",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fullgraph data: error: unknown dataset")


def test_cli_info_prints_sizes(tmp_path: Path) -> None:
    write_ogb_dir(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fullgraph.cli",
            "data",
            "info",
            "--dataset",
            "ogbn-toy",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nodes        6" in proc.stdout
    assert "edges        8 directed" in proc.stdout
    assert "train 2 / val 1 / test 1" in proc.stdout


def _gzb(text: str) -> bytes:
    return gzip.compress(text.encode())


#: case -> (file under the dataset directory, new content or edit of the old bytes, message)
BAD_FILES = {
    "edge-truncated": ("raw/edge.csv.gz", lambda b: b[: len(b) // 2], r"not a readable gzip"),
    "edge-not-gzip": ("raw/edge.csv.gz", b"0,1\n1,2\n", r"not a readable gzip file \(zlib"),
    "edge-empty-gzip": ("raw/edge.csv.gz", _gzb(""), r"the file is empty"),
    "edge-zero-bytes": ("raw/edge.csv.gz", b"", r"the file is empty"),
    "edge-3-columns": ("raw/edge.csv.gz", _gzb("0,1,2\n"), r"3 comma-separated columns.*2"),
    "edge-ragged": ("raw/edge.csv.gz", _gzb("0,1\n1,2,3\n"), r"Expected 2 columns, got 3"),
    "edge-text": ("raw/edge.csv.gz", _gzb("0,1\nu,v\n"), r"cannot parse as CSV of int64"),
    "edge-empty-field": ("raw/edge.csv.gz", _gzb("0,1\n2,\n"), r"empty field"),
    "feat-not-gzip": ("raw/node-feat.csv.gz", b"1,2,3\n", r"node-feat\.csv\.gz: not a read"),
    "feat-text": ("raw/node-feat.csv.gz", _gzb("1,2,x\n" * N), r"CSV of float32"),
    "label-text": ("raw/node-label.csv.gz", _gzb("a\n" * N), r"CSV of float64"),
    "label-fractional": ("raw/node-label.csv.gz", _gzb("0\n1.5\n" * 3), r"label 1\.5 of node 1"),
    "label-2-columns": ("raw/node-label.csv.gz", _gzb("0,1\n" * N), r"2 label columns"),
    "nodes-fewer": ("raw/num-node-list.csv.gz", _gzb("4\n"), r"6 labels but 4 nodes \(num-node"),
    "nodes-huge": ("raw/num-node-list.csv.gz", _gzb(f"{10**12}\n"), r"6 labels but 10+ nodes"),
    "edges-beyond-nodes": (
        "raw/edge.csv.gz",
        lambda b: _gzb(gzip.decompress(b).decode().replace("5,0", "5,6")),
        r"edge\.csv\.gz: edge 6 has endpoint 6 out of range \[0, 6\) "
        r"\(num-node-list\.csv\.gz says 6 nodes",
    ),
    "nodes-more": ("raw/num-node-list.csv.gz", _gzb("9\n"), r"6 labels but 9 nodes"),
    "nodes-zero": ("raw/num-node-list.csv.gz", _gzb("0\n"), r"count 0 is below 1"),
    "nodes-text": ("raw/num-node-list.csv.gz", _gzb("six\n"), r"cannot parse as CSV of int64"),
    "nodes-two-rows": ("raw/num-node-list.csv.gz", _gzb("6\n6\n"), r"2 rows, expected one"),
    "edges-negative": ("raw/num-edge-list.csv.gz", _gzb("-1\n"), r"count -1 is below 0"),
    "split-2-columns": ("split/time/valid.csv.gz", _gzb("3,4\n"), r"2 comma-separated columns"),
    "split-truncated": ("split/time/test.csv.gz", lambda b: b[:12], r"not a readable gzip"),
    "split-overlap": (
        "split/time/valid.csv.gz",
        _gzb("3\n1\n"),
        r"node 1 is in both train\.csv\.gz and valid\.csv\.gz",
    ),
    "marker-not-object": ("meta.json", b"[1, 2]", r"meta\.json: expected a JSON object"),
    "marker-not-json": ("meta.json", b"{oops", r"meta\.json: not valid JSON"),
    "marker-classes": (
        "meta.json",
        b'{"format": "fullgraph-ogb-v1", "num_classes": 1}',
        r"meta\.json: num_classes is 1 but .*node-label\.csv\.gz holds label 1",
    ),
    "marker-classes-type": (
        "meta.json",
        b'{"format": "fullgraph-ogb-v1", "num_classes": "2"}',
        r"meta\.json: num_classes must be a non-negative integer, got '2'",
    ),
    "marker-binary": ("meta.json", b"\xff\xfe\x00", r"meta\.json: not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_file_is_one_line_naming_it(tmp_path: Path, capsys, case: str) -> None:
    """Truncated, non-gzip, empty, non-numeric, ragged or inconsistent files: one line, exit 2."""
    from fullgraph.cli import main

    rel, content, message = BAD_FILES[case]
    d = write_ogb_dir(tmp_path)
    path = d / rel
    old = path.read_bytes() if path.exists() else b""
    path.write_bytes(content(old) if callable(content) else content)
    assert main(["data", "info", "--dataset", "ogbn-toy", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fullgraph data: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert str(d) in err and path.name in err  # names the file (split-overlap: two files)
    assert re.search(message, err), err
    assert not (d / "processed").exists()  # nothing cached from a failed parse
