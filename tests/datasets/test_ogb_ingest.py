"""The out-of-core OGB ingest: the in-memory reader's graph, exact bucket bounds on skewed
ids, one-line refusals naming the file and line, nothing left by a failed or interrupted run."""

from __future__ import annotations

import errno
import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from fullgraph.datasets import load, ogb_ingest, synthetic_chunked
from fullgraph.datasets.edges import edges_to_csr
from fullgraph.datasets.ogb import read_ogb
from fullgraph.datasets.ogb_ingest import ingest_ogb
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.errors import ConfigError, DataError, OutputError

ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many CSV blocks, buckets, row ranges and releases on small graphs."""
    monkeypatch.setattr(ogb_ingest, "BLOCK_BYTES", 1 << 12)
    monkeypatch.setattr(synthetic_chunked, "BUCKET_KEYS", 1 << 8)
    monkeypatch.setattr(synthetic_chunked, "ROW_BUFFER", 1 << 9)
    monkeypatch.setattr(synthetic_chunked, "RELEASE_BYTES", 1 << 12)


def _gz(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write("".join(line + "\n" for line in lines).encode())


def _source(root: Path, seed: int = 0) -> Path:
    """The tiny preset in OGB layout at ``root/g``."""
    return write_ogb(generate("tiny", seed=seed), root, "g")


def _set_edges(d: Path, src: np.ndarray, dst: np.ndarray) -> None:
    """Replace the dataset's edge file (and its count) by the edges ``src -> dst``."""
    _gz(d / "raw" / "edge.csv.gz", [f"{u},{v}" for u, v in zip(src, dst, strict=True)])
    _gz(d / "raw" / "num-edge-list.csv.gz", [str(len(src))])


def _assert_same(root: Path, name: str = "g", out: str = "g-npy") -> None:
    want = read_ogb(root, name, cache=False)
    got = load(out, root, mmap=True)
    for a in ARRAYS:
        np.testing.assert_array_equal(getattr(got, a), getattr(want, a), err_msg=a)
    assert got.num_classes == want.num_classes


def test_ingest_equals_the_in_memory_reader(tmp_path: Path) -> None:
    _source(tmp_path)
    path = ingest_ogb(tmp_path, "g")
    assert path == tmp_path / "g_npy"
    assert sorted(p.name for p in path.iterdir()) == ["arrays", "meta.json"]  # no scratch
    _assert_same(tmp_path)


@pytest.mark.parametrize("case", ["random", "isolated", "no-edges", "loops-only"])
def test_csr_equals_edges_to_csr(tmp_path: Path, case: str) -> None:
    """Duplicates, both directions, self loops, isolated nodes, no edges at all."""
    d = _source(tmp_path)
    n = 3000
    rng = np.random.default_rng(7)
    if case in ("random", "isolated"):
        hi = n if case == "random" else n // 3  # isolated: the top two thirds
        src, dst = rng.integers(0, hi, 4000), rng.integers(0, hi, 4000)
        src = np.concatenate([src, dst[:500], src[:300], np.arange(50)])  # reversed, repeated
        dst = np.concatenate([dst, src[:500], dst[:300], np.arange(50)])  # and self loops
    elif case == "loops-only":
        src = dst = np.arange(20)
    else:
        src = dst = np.zeros(0, dtype=np.int64)
    _set_edges(d, src, dst)
    ingest_ogb(tmp_path, "g")
    got = load("g-npy", tmp_path, mmap=True)
    indptr, indices = edges_to_csr(src, dst, n, symmetric=True, remove_self_loops=True)
    np.testing.assert_array_equal(got.indptr, indptr)
    np.testing.assert_array_equal(got.indices, indices)
    _assert_same(tmp_path)


def test_skewed_ids_keep_every_bucket_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every edge on three hubs (the first id, one inside, the last): a bucket holds at most
    BUCKET_KEYS keys unless it is one id's, as min and as max (the transpose)."""
    d = _source(tmp_path)
    n, limit = 3000, synthetic_chunked.BUCKET_KEYS
    rng = np.random.default_rng(1)
    hubs = np.repeat([0, 1234, n - 1], 1500)
    others = rng.integers(0, n, hubs.shape[0])
    src = np.concatenate([hubs, others[:700]])  # some edges twice, the other way round
    dst = np.concatenate([others, hubs[:700]])
    _set_edges(d, src, dst)
    seen = []
    sorted_bucket = synthetic_chunked._sorted_bucket

    def spy(path: Path, low: int, high: int, n_: int) -> np.ndarray:
        seen.append((os.path.getsize(path) // 8, (high - low) // n_))
        return sorted_bucket(path, low, high, n_)

    monkeypatch.setattr(synthetic_chunked, "_sorted_bucket", spy)
    ingest_ogb(tmp_path, "g")
    assert all(keys <= limit or ids == 1 for keys, ids in seen), seen
    assert any(keys > limit for keys, _ in seen)  # a hub's bucket went through the presence path
    _assert_same(tmp_path)


def test_bounds_from_counts_on_any_order() -> None:
    limit = synthetic_chunked.BUCKET_KEYS
    counts = np.zeros(1000, dtype=np.int64)
    counts[[0, 5, 999]] = [3 * limit, 10, 2 * limit]
    counts[100:900] = 1
    bounds = synthetic_chunked.bounds_from_counts(counts, 1000)
    edges = [0, *(bounds // 1000).tolist(), 1000]
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        assert counts[a:b].sum() <= limit or b - a == 1, (a, b)
    assert bounds.tolist() == sorted(set(bounds.tolist()))


def test_float16_features_are_the_float32_rounded(tmp_path: Path) -> None:
    _source(tmp_path)
    ingest_ogb(tmp_path, "g", feature_dtype="float16")
    want = read_ogb(tmp_path, "g", cache=False).x
    mapped = load("g-npy", tmp_path, mmap=True)
    assert mapped.x.dtype == np.float16
    np.testing.assert_array_equal(mapped.x, want.astype(np.float16))


def _set_feature(d: Path, line: int, value: str) -> None:
    """Write value ``value`` into the first column of line ``line`` of node-feat.csv.gz."""
    path = d / "raw" / "node-feat.csv.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    row = lines[line - 1].split(",")
    lines[line - 1] = ",".join([value, *row[1:]])
    _gz(path, lines)


@pytest.mark.parametrize(
    ("value", "dtype", "needles"),
    [
        ("nan", "float32", ["line 2345 (node 2344)", "not a finite float32"]),
        ("1e40", "float32", ["line 2345 (node 2344)", "not a finite float32"]),
        ("70000", "float16", ["line 2345 (node 2344)", "float16", "--feature-dtype float32"]),
    ],
)
def test_bad_feature_names_its_line(
    tmp_path: Path, value: str, dtype: str, needles: list[str]
) -> None:
    d = _source(tmp_path)
    _set_feature(d, 2345, value)
    with pytest.raises(DataError) as err:
        ingest_ogb(tmp_path, "g", feature_dtype=dtype)
    for needle in ["node-feat.csv.gz", *needles]:
        assert needle in str(err.value), str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["g"]  # no dataset, no temporary directory


def test_out_of_range_id_names_its_line(tmp_path: Path) -> None:
    d = _source(tmp_path)
    src, dst = np.arange(2000) % 3000, (np.arange(2000) * 7 + 1) % 3000
    dst[1500] = 3000
    _set_edges(d, src, dst)
    with pytest.raises(DataError) as err:
        ingest_ogb(tmp_path, "g")
    msg = str(err.value)
    assert "edge.csv.gz: line 1501 (edge 1500) has endpoint 3000 out of range" in msg, msg
    assert "num-node-list.csv.gz says 3000 nodes" in msg
    assert sorted(os.listdir(tmp_path)) == ["g"]


@pytest.mark.parametrize("fname", ["edge.csv.gz", "node-feat.csv.gz"])
def test_truncated_gzip_is_one_line(tmp_path: Path, fname: str) -> None:
    d = _source(tmp_path)
    path = d / "raw" / fname
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as err:
        ingest_ogb(tmp_path, "g")
    msg = str(err.value)
    assert fname in msg and "truncated or corrupted" in msg and "\n" not in msg, msg
    assert sorted(os.listdir(tmp_path)) == ["g"]


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("17,x", ["cannot parse as CSV of int64", "the error follows line"]),
        ("1,2,3", ["Expected 2 columns, got 3", "the error follows line"]),
        ("17,", ["line 1201 has an empty field"]),
    ],
)
def test_malformed_edge_line_is_one_line(tmp_path: Path, line: str, needles: list[str]) -> None:
    d = _source(tmp_path)
    lines = [f"{i},{(i * 7 + 1) % 3000}" for i in range(2000)]
    lines[1200] = line
    _gz(d / "raw" / "edge.csv.gz", lines)
    with pytest.raises(DataError) as err:
        ingest_ogb(tmp_path, "g")
    for needle in ["edge.csv.gz", *needles]:
        assert needle in str(err.value), str(err.value)


def test_counts_must_match_the_rows(tmp_path: Path) -> None:
    d = _source(tmp_path)
    _gz(d / "raw" / "num-edge-list.csv.gz", ["5"])
    with pytest.raises(DataError, match="edges but num-edge-list says 5"):
        ingest_ogb(tmp_path, "g")
    d = _source(tmp_path / "b")
    _gz(d / "raw" / "num-node-list.csv.gz", ["2999"])
    with pytest.raises(DataError, match="3000 labels but 2999 nodes"):
        ingest_ogb(tmp_path / "b", "g")


@pytest.mark.parametrize(
    ("stage", "error", "raised"),
    [
        ("_write_features", OSError(errno.ENOSPC, "No space left on device"), OutputError),
        ("_write_features", KeyboardInterrupt(), KeyboardInterrupt),  # Ctrl-C, SIGTERM via CLI
        ("read_split_masks", KeyboardInterrupt(), KeyboardInterrupt),
    ],
)
def test_interrupted_ingest_leaves_nothing_and_a_rerun_succeeds(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    error: BaseException,
    raised: type[BaseException],
) -> None:
    _source(tmp_path)
    write = getattr(ogb_ingest, stage)

    def stop(*args: object) -> None:
        assert any(tmp_path.glob(".g_npy.tmp-*/arrays"))  # inside the temporary directory
        raise error

    monkeypatch.setattr(ogb_ingest, stage, stop)
    with pytest.raises(raised):
        ingest_ogb(tmp_path, "g")
    assert sorted(os.listdir(tmp_path)) == ["g"]
    monkeypatch.setattr(ogb_ingest, stage, write)
    ingest_ogb(tmp_path, "g")
    _assert_same(tmp_path)


@pytest.mark.parametrize("fname", ["edge_weight.csv.gz", "edge_feat.csv.gz"])
def test_edge_values_are_refused(tmp_path: Path, fname: str) -> None:
    d = _source(tmp_path)
    _gz(d / "raw" / fname, ["1.0"])
    with pytest.raises(ConfigError, match=f"{fname}: the npy layout holds no edge values"):
        ingest_ogb(tmp_path, "g")
    assert sorted(os.listdir(tmp_path)) == ["g"]


def test_directed_reading_and_bad_outputs_are_refused(tmp_path: Path) -> None:
    _source(tmp_path)
    with pytest.raises(ConfigError, match="in-memory reader"):
        ingest_ogb(tmp_path, "g", symmetric=False)
    with pytest.raises(ConfigError, match="is inside the dataset directory"):
        ingest_ogb(tmp_path, "g", out_root=tmp_path / "g")
    with pytest.raises(ConfigError, match="--feature-dtype"):
        ingest_ogb(tmp_path, "g", feature_dtype="bfloat16")
    ingest_ogb(tmp_path, "g")
    with pytest.raises(FileExistsError):
        ingest_ogb(tmp_path, "g")
    with pytest.raises(ConfigError, match="npy layout already"):
        ingest_ogb(tmp_path, "g-npy")
    ingest_ogb(tmp_path, "g", force=True)
    _assert_same(tmp_path)
