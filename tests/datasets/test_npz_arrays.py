"""``.npz`` readers (gnn-benchmark, heterophilous) on small hand-made files; bad arrays are caught
before scipy sees them and reported as one line naming the file and the array."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fullgraph.cli import main
from fullgraph.datasets import load

N = 6
RING_INDPTR = np.arange(N + 1, dtype=np.int64)  # row v holds one entry: (v + 1) % N
RING_INDICES = (np.arange(N, dtype=np.int64) + 1) % N


def benchmark_arrays() -> dict[str, np.ndarray]:
    """A 6-node gnn-benchmark graph: a ring, 4 sparse features, 3 classes."""
    return {
        "adj_data": np.ones(N, dtype=np.float32),
        "adj_indices": RING_INDICES.copy(),
        "adj_indptr": RING_INDPTR.copy(),
        "adj_shape": np.array([N, N]),
        "attr_data": np.arange(1, N + 1, dtype=np.float32),
        "attr_indices": np.arange(N, dtype=np.int64) % 4,
        "attr_indptr": RING_INDPTR.copy(),
        "attr_shape": np.array([N, 4]),
        "labels": np.arange(N, dtype=np.int64) % 3,
    }


def hetero_arrays() -> dict[str, np.ndarray]:
    """A 6-node heterophilous-graphs file (tolokers layout), two fixed splits."""
    masks = np.zeros((2, 3, N), dtype=np.bool_)  # split, (train, val, test), node
    masks[:, 0, :2] = masks[:, 1, 2:4] = masks[:, 2, 4:] = True
    return {
        "node_features": np.arange(N * 2, dtype=np.float32).reshape(N, 2),
        "node_labels": np.arange(N, dtype=np.int64) % 2,
        "edges": np.stack([np.arange(N), (np.arange(N) + 1) % N], axis=1),
        "train_masks": masks[:, 0],
        "val_masks": masks[:, 1],
        "test_masks": masks[:, 2],
    }


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_benchmark(root: Path, arrays: dict[str, np.ndarray]) -> Path:
    raw = root / "amazon_photo" / "raw"
    raw.mkdir(parents=True)
    path = raw / "amazon_electronics_photo.npz"
    path.write_bytes(npz_bytes(arrays))
    return path


def write_hetero(root: Path, arrays: dict[str, np.ndarray]) -> Path:
    raw = root / "tolokers" / "raw"
    raw.mkdir(parents=True)
    path = raw / "tolokers.npz"
    path.write_bytes(npz_bytes(arrays))
    return path


def data_info_error(capsys: pytest.CaptureFixture, name: str, root: Path) -> str:
    """Run ``fullgraph data info`` in-process; assert exit 2 and one stderr line; return it."""
    assert main(["data", "info", "--dataset", name, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fullgraph data: error: ")
    return err


def test_small_files_load(tmp_path: Path) -> None:
    write_benchmark(tmp_path, benchmark_arrays())
    g = load("amazon-photo", tmp_path)
    assert (g.num_nodes, g.num_edges, g.num_classes, g.num_features) == (N, 2 * N, 3, 4)
    assert g.x[5, 1] == 6.0  # node 5 has feature 5 % 4 = 1 with value 6
    write_hetero(tmp_path, hetero_arrays())
    t = load("tolokers", tmp_path)
    assert (t.num_nodes, t.num_edges, t.num_classes) == (N, 2 * N, 2)
    assert np.flatnonzero(t.test_mask).tolist() == [4, 5]


def test_a_fixed_split_is_chosen_end_to_end(tmp_path: Path, capsys) -> None:
    """``--split K`` reads split K of the file; the partition records it in meta.json and a
    run in its config.json; a split past the dataset's count is refused in one line."""
    arrays = hetero_arrays()
    for key in ("train_masks", "val_masks", "test_masks"):
        arrays[key][1] = np.roll(arrays[key][1], 2)  # split 1: the same shares, moved by 2
    write_hetero(tmp_path, arrays)
    assert np.flatnonzero(load("tolokers", tmp_path).test_mask).tolist() == [4, 5]
    one = load("tolokers", tmp_path, split=1)
    assert np.flatnonzero(one.test_mask).tolist() == [0, 1] and one.meta["split"] == 1
    parts = tmp_path / "parts"
    argv = ["partition", "--dataset", "tolokers", "--root", str(tmp_path), "--parts", "2"]
    assert main([*argv, "--method", "contiguous", "--split", "1", "--out", str(parts)]) == 0
    assert json.loads((parts / "meta.json").read_text())["split"] == 1
    log = tmp_path / "run.jsonl"
    argv = ["train", "--dataset", "tolokers", "--root", str(tmp_path), "--epochs", "1"]
    assert main([*argv, "--split", "1", "--quiet", "--log-json", str(log)]) == 0
    config = json.loads((tmp_path / "run.config.json").read_text())
    assert (config["split"], config["metric"]) == (1, "rocauc")
    assert main([*argv, "--split", "10"]) == 2
    err = capsys.readouterr().err
    assert "--split: tolokers has 10 fixed splits (0-9), not 10" in err and err.count("\n") == 1


def _set(key: str, value: object) -> Callable[[dict], None]:
    def edit(a: dict) -> None:
        a[key] = np.asarray(value)

    return edit


def _drop(key: str) -> Callable[[dict], None]:
    return lambda a: a.pop(key)


def _nan_attr(a: dict) -> None:
    a["attr_data"] = a["attr_data"].copy()
    a["attr_data"][2] = np.nan


BENCHMARK_CASES = {
    "indptr-past-end": (
        _set("adj_indptr", [0, 1, 2, 3, 4, 5, 99]),
        r"adj_indptr ends at 99 but adj_indices has 6 entries",
    ),
    "indptr-decreasing": (
        _set("adj_indptr", [0, 1, 3, 2, 4, 5, 6]),
        r"adj_indptr decreases at row 2",
    ),
    "indptr-length": (_set("adj_indptr", RING_INDPTR[:-1]), r"adj_indptr has 6 entries.*= 7"),
    "indptr-start": (_set("adj_indptr", [1, 1, 2, 3, 4, 5, 6]), r"adj_indptr starts at 1"),
    "index-too-big": (
        _set("adj_indices", [1, 2, 3, 4, 5, 6]),
        r"adj_indices holds column 6, outside \[0, 6\)",
    ),
    "index-negative": (_set("adj_indices", [1, 2, 3, 4, 5, -1]), r"adj_indices holds column -1"),
    "not-square": (_set("adj_shape", [N, N + 1]), r"adj_shape is \[6, 7\].*must be square"),
    "shape-not-2": (_set("adj_shape", [N]), r"adj_shape is \[6\], expected two"),
    "data-length": (_set("adj_data", np.ones(5)), r"adj_data has 5 entries but adj_indices"),
    "attr-indptr": (_set("attr_indptr", [0, 2, 1, 3, 4, 5, 6]), r"attr_indptr decreases"),
    "attr-index": (_set("attr_indices", [0, 1, 2, 3, 4, 0]), r"attr_indices holds column 4"),
    "attr-rows": (_set("attr_shape", [N - 1, 4]), r"attr_indptr has 7 entries"),
    "attr-nan": (_nan_attr, r"attr_data\[\d+\] is nan, not a finite float32"),
    "attr-piece-missing": (_drop("attr_indices"), r"missing arrays \['attr_indices'\]"),
    "labels-missing": (_drop("labels"), r"missing arrays \['labels'\]"),
    "labels-negative": (
        _set("labels", [0, 1, -1, 0, 1, 2]),
        r"labels gives node 2 the negative label -1",
    ),
    "labels-fractional": (_set("labels", [0, 1, 2.5, 0, 1, 2]), r"labels holds 2.5, expected"),
    "labels-nan": (_set("labels", [0, 1, np.nan, 0, 1, 2]), r"labels holds nan, expected"),
    "labels-strings": (_set("labels", list("abcabc")), r"labels holds <U1 values"),
    "labels-length": (_set("labels", [0, 1, 2, 0, 1]), r"labels has 5 entries but .* 6 nodes"),
}


@pytest.mark.parametrize("case", list(BENCHMARK_CASES))
def test_gnn_benchmark_bad_arrays(tmp_path: Path, capsys, case: str) -> None:
    edit, message = BENCHMARK_CASES[case]
    arrays = benchmark_arrays()
    edit(arrays)
    path = write_benchmark(tmp_path, arrays)
    err = data_info_error(capsys, "amazon-photo", tmp_path)
    assert str(path) in err
    assert re.search(message, err), err


def _overlap(a: dict) -> None:
    a["test_masks"] = a["test_masks"].copy()
    a["test_masks"][0, 1] = True  # node 1 trains and tests


HETERO_CASES = {
    "edges-3-columns": (_set("edges", np.zeros((4, 3), np.int64)), r"edges have shape \(4, 3\)"),
    "edges-out-of-range": (
        _set("edges", [[0, 1], [2, 99]]),
        r"\(edges\): edge 1 has endpoint 99 out of range \[0, 6\)",
    ),
    "edges-fractional": (_set("edges", [[0, 1.5]]), r"edges holds 1.5, expected integers"),
    "labels-negative": (_set("node_labels", [0, 1, 0, -3, 1, 0]), r"negative label -3"),
    "features-nan": (
        _set("node_features", np.full((N, 2), np.nan, np.float32)),
        r"node_features\[0, 0\] is nan, not a finite float32",
    ),
    "features-rows": (_set("node_features", np.zeros((N - 1, 2))), r"node_features has 5 rows"),
    "features-1d": (_set("node_features", np.zeros(N)), r"node_features has shape \(6,\)"),
    "masks-shape": (_set("train_masks", np.ones((2, N - 1), bool)), r"train_masks has shape"),
    "masks-values": (_set("val_masks", np.full((2, N), 2)), r"val_masks holds values other"),
    "masks-missing": (_drop("test_masks"), r"missing arrays \['test_masks'\]"),
    "splits-overlap": (_overlap, r"node 1 is in both train_masks and test_masks of split 0"),
}


@pytest.mark.parametrize("case", list(HETERO_CASES))
def test_heterophilous_bad_arrays(tmp_path: Path, capsys, case: str) -> None:
    edit, message = HETERO_CASES[case]
    arrays = hetero_arrays()
    edit(arrays)
    write_hetero(tmp_path, arrays)
    err = data_info_error(capsys, "tolokers", tmp_path)
    assert "tolokers" in err
    assert re.search(message, err), err


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    return buf.getvalue()


GOOD = npz_bytes(benchmark_arrays())
FILE_CASES = {
    "text-named-npz": ("npz", b"not an archive\n", r"not an \.npz archive \(it does not start"),
    "npy-named-npz": ("npz", _npy(), r"not an \.npz archive"),
    "empty-npz": ("npz", b"", r"not an \.npz archive"),
    "truncated-npz": ("npz", GOOD[: len(GOOD) // 2], r"not a readable \.npz archive"),
    "text-named-zip": ("zip", b"hello\n", r"amazon-photo\.zip: not a readable zip archive"),
    "zip-without-npz": ("zip", _zip({"README": b"hi"}), r"holds no \.npz file"),
    "zip-with-bad-npz": (
        "zip",
        _zip({"amazon_electronics_photo.npz": b"PK\x03\x04garbage"}),
        r"amazon-photo\.zip \(amazon_electronics_photo\.npz\): not a readable \.npz archive",
    ),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_npz_file_not_an_archive(tmp_path: Path, capsys, case: str) -> None:
    kind, data, message = FILE_CASES[case]
    raw = tmp_path / "amazon_photo" / "raw"
    raw.mkdir(parents=True)
    name = "amazon_electronics_photo.npz" if kind == "npz" else "amazon-photo.zip"
    (raw / name).write_bytes(data)
    err = data_info_error(capsys, "amazon-photo", tmp_path)
    assert re.search(message, err), err
