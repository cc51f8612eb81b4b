"""Bad input around partitions: corruption, truncation, overwrite, failures midway, bad P, CLI.

Enters through :mod:`fullgraph.partition.build` and :mod:`fullgraph.partition.verify`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fullgraph.datasets
import fullgraph.partition.build as build
from fullgraph.cli import main
from fullgraph.errors import ConfigError, DataError, PartitionError
from fullgraph.partition import (
    assign_parts,
    load_partition,
    partition_graph,
    verify_partitions,
    write_partitions,
)
from fullgraph.partition.format import sha256_file


@pytest.fixture
def parts4(small_partitions, tmp_path) -> Path:
    """A private copy of the 4-part partition, free to tamper with."""
    return Path(shutil.copytree(small_partitions[4], tmp_path / "p4"))


@pytest.fixture
def fake_load(monkeypatch, small_graph):
    """Make ``fullgraph.datasets.load`` return ``small_graph`` for its name, like a real loader."""

    def load(name, root, **kwargs):
        if name != small_graph.name:
            raise DataError(f"unknown dataset {name!r}")
        return small_graph

    monkeypatch.setattr(fullgraph.datasets, "load", load, raising=False)
    return load


def rewrite(path: Path, key: str, array: np.ndarray) -> None:
    """Replace ``path/key`` with ``array`` and record its new checksum and size in meta.json."""
    np.save(path / key, array)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"][key].update(sha256=sha256_file(path / key), bytes=(path / key).stat().st_size)
    (path / "meta.json").write_text(json.dumps(meta))


def test_corrupted_file_names_it(parts4):
    f = parts4 / "part-1" / "x.npy"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=r"part-1/x\.npy fails its sha256"):
        load_partition(parts4, 1)
    load_partition(parts4, 0)  # other parts still load
    with pytest.raises(PartitionError, match=r"part-1/x\.npy"):
        verify_partitions(parts4)


def test_truncated_file_names_it(parts4):
    f = parts4 / "part-2" / "indices.npy"
    f.write_bytes(f.read_bytes()[:-16])
    with pytest.raises(PartitionError, match=r"part-2/indices\.npy has \d+ bytes.*truncated"):
        load_partition(parts4, 2, verify_checksums=False)


def test_missing_file_and_meta(parts4, tmp_path):
    (parts4 / "part-3" / "y.npy").unlink()
    with pytest.raises(PartitionError, match=r"part-3/y\.npy is missing"):
        load_partition(parts4, 3)
    (parts4 / "meta.json").unlink()
    with pytest.raises(PartitionError, match="meta.json"):
        load_partition(parts4, 0)
    with pytest.raises(PartitionError, match="does not exist"):
        load_partition(tmp_path / "nowhere", 0)


@pytest.mark.parametrize("rank", [-1, 4, 99])
def test_rank_out_of_range(small_partitions, rank):
    with pytest.raises(PartitionError, match=f"rank {rank} out of range.*4 parts"):
        load_partition(small_partitions[4], rank)


def test_refuses_overwrite_without_force(small_graph, tmp_path):
    out = tmp_path / "out"
    partition_graph(small_graph, 2, out)
    with pytest.raises(FileExistsError, match="already exists"):
        partition_graph(small_graph, 4, out)
    assert json.loads((out / "meta.json").read_text())["num_parts"] == 2
    partition_graph(small_graph, 4, out, force=True)
    assert json.loads((out / "meta.json").read_text())["num_parts"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("existing", [False, True])
def test_failure_midway_leaves_nothing(small_graph, tmp_path, monkeypatch, existing):
    out = tmp_path / "out"
    if existing:
        partition_graph(small_graph, 2, out)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    calls = []
    real = build.save_array

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 20:
            raise OSError("disk full (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "save_array", failing)
    with pytest.raises(OSError, match="simulated"):
        partition_graph(small_graph, 4, out, force=existing)
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if existing else [])
    if existing:  # the old partition is untouched
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("num_parts", [0, -2, 601])
def test_bad_num_parts(small_graph, tmp_path, num_parts):
    with pytest.raises(ConfigError, match="parts"):
        partition_graph(small_graph, num_parts, tmp_path / "out")
    with pytest.raises(ConfigError):
        assign_parts(small_graph, num_parts)
    assert not (tmp_path / "out").exists()


def test_bad_method_and_owner(small_graph, tmp_path):
    with pytest.raises(ConfigError, match="unknown partition method 'kway'"):
        assign_parts(small_graph, 2, method="kway")
    with pytest.raises(PartitionError, match="shape"):
        write_partitions(small_graph, np.zeros(5, np.int64), tmp_path / "o", method="x", seed=0)
    owner = np.zeros(small_graph.num_nodes, np.int64)
    owner[0] = 3
    with pytest.raises(PartitionError, match="rank 3 >= num_parts 2"):
        write_partitions(small_graph, owner, tmp_path / "o", method="x", seed=0, num_parts=2)


def test_empty_part_is_written_and_verified(small_graph, tmp_path):
    owner = np.zeros(small_graph.num_nodes, np.int64)
    owner[::2] = 2  # part 1 stays empty
    write_partitions(small_graph, owner, tmp_path / "o", method="manual", seed=0, num_parts=3)
    verify_partitions(tmp_path / "o", small_graph)
    assert load_partition(tmp_path / "o", 1).num_inner == 0


def test_verify_catches_tampered_label(parts4, small_graph):
    y = np.load(parts4 / "part-1" / "y.npy")
    y[3] = (y[3] + 1) % small_graph.num_classes
    rewrite(parts4, "part-1/y.npy", y)
    load_partition(parts4, 1)  # checksums agree: only the semantic check can tell
    verify_partitions(parts4)  # internally consistent
    with pytest.raises(PartitionError, match=r"part-1: y of node \d+ differs from the source"):
        verify_partitions(parts4, small_graph)


def test_verify_catches_tampered_send_list(parts4):
    send = np.load(parts4 / "part-0" / "send_index.npy")
    send[[0, 1]] = send[[1, 0]]
    rewrite(parts4, "part-0/send_index.npy", send)
    with pytest.raises(PartitionError, match="part-0 sends part-. other rows"):
        verify_partitions(parts4)


def test_verify_catches_rewired_edge(parts4, small_graph):
    indices = np.load(parts4 / "part-2" / "indices.npy")
    indices[0] = (indices[0] + 1) % 10  # another source, same count
    rewrite(parts4, "part-2/indices.npy", indices)
    with pytest.raises(PartitionError, match="part-2"):
        verify_partitions(parts4, small_graph)


def test_verify_in_small_row_blocks_catches_a_late_edge_and_label(parts4, small_graph, monkeypatch):
    """Against the graph, parts are compared a block of rows at a time: the last rows count."""
    import fullgraph.partition.verify as verify

    monkeypatch.setattr(verify, "EDGE_BLOCK", 7)  # many blocks even on the test graph
    verify_partitions(parts4, small_graph)
    part = load_partition(parts4, 3)
    last = int(part.global_ids[part.num_inner - 1])
    y = np.load(parts4 / "part-3" / "y.npy")
    y[-1] = (y[-1] + 1) % small_graph.num_classes
    rewrite(parts4, "part-3/y.npy", y)
    with pytest.raises(PartitionError, match=f"part-3: y of node {last} differs"):
        verify_partitions(parts4, small_graph)
    y[-1] = (y[-1] - 1) % small_graph.num_classes
    rewrite(parts4, "part-3/y.npy", y)  # restored
    verify_partitions(parts4, small_graph)
    indices = np.load(parts4 / "part-3" / "indices.npy")
    lo = int(part.indptr[part.num_inner - 1])
    row = indices[lo:]  # the last row's sources: rewire one from an inner node to another
    k = lo + int(np.flatnonzero(row < part.num_inner)[0])
    indices[k] = next(v for v in range(part.num_inner) if v not in set(row.tolist()))
    rewrite(parts4, "part-3/indices.npy", indices)
    with pytest.raises(PartitionError, match=f"incoming edges of node {last} differ"):
        verify_partitions(parts4, small_graph)


def test_cli_partition_and_verify(small_graph, tmp_path, fake_load, capsys):
    out = tmp_path / "parts"
    args = ["partition", "--dataset", small_graph.name, "--root", str(tmp_path)]
    assert main([*args, "--parts", "2", "--out", str(out), "--method", "random"]) == 0
    printed = capsys.readouterr().out
    assert "rows exchanged per layer" in printed and "imbalance" in printed
    assert main(["verify", str(out), "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {out}: 2 parts")
    assert main([*args, "--parts", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fullgraph partition: error: ") and "already exists" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parts", "0"], "at least 1"),
        (["--parts", "601"], "P > num_nodes"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--method", "random", "--assign", "kway"], "--assign kway applies to --method metis"),
        (["--assign", "kway", "--block-size", "8"], "--block-size applies to --assign blocks"),
        (["--block-size", "0"], "block size must be a positive integer, got 0"),
        (["--parts", "400", "--block-size", "2"], "blocks into 400 parts (P > number of blocks)"),
    ],
)
def test_cli_partition_errors(small_graph, tmp_path, fake_load, capsys, argv, message):
    base = {"--dataset": small_graph.name, "--root": str(tmp_path), "--parts": "2"}
    base.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    flat = [s for kv in base.items() for s in kv]
    assert main(["partition", *flat, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fullgraph partition: error: ") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_cli_verify_errors(parts4, tmp_path, capsys):
    assert main(["verify", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    f = parts4 / "part-0" / "indptr.npy"
    f.write_bytes(f.read_bytes()[:-8])
    assert main(["verify", str(parts4)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fullgraph verify: error: ") and "part-0/indptr.npy" in err
    assert main(["verify", str(parts4), "--dataset", "x"]) == 2
    assert "--dataset needs --root" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_cli_end_to_end_on_disk(small_graph, tmp_path):
    """Write the graph in OGB layout, partition and verify it through the real command."""
    from fullgraph.datasets.ogb_writer import write_ogb

    write_ogb(small_graph, tmp_path / "data", "sbm-disk")
    run = [sys.executable, "-m", "fullgraph.cli"]
    data = ["--dataset", "sbm-disk", "--root", str(tmp_path / "data")]
    out = str(tmp_path / "parts")
    done = subprocess.run(
        [*run, "partition", *data, "--parts", "4", "--out", out], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "halo rows per part" in done.stdout
    done = subprocess.run([*run, "verify", out, *data], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout and "against sbm-disk" in done.stdout


def test_meta_without_keys_or_other_version(parts4):
    meta = json.loads((parts4 / "meta.json").read_text())
    (parts4 / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(PartitionError, match="format_version 99"):
        load_partition(parts4, 0)
    del meta["files"]
    (parts4 / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="lacks files"):
        load_partition(parts4, 0)
    (parts4 / "meta.json").write_text("{not json")
    with pytest.raises(PartitionError, match="not valid JSON"):
        verify_partitions(parts4)


def _edit(**changes):
    """An edit of meta.json: top-level ``key=value``, or ``parts__R__key=value`` for part R."""

    def edit(meta: dict) -> None:
        for key, value in changes.items():
            target, field = meta, key
            if key.startswith("parts__"):
                _, r, field = key.split("__")
                target = meta["parts"][int(r)]
            elif key.startswith("files__"):
                target, field = meta["files"]["part-0/x.npy"], key.split("__")[1]
            if callable(value):
                value = value(target[field])
            if value is _DROP:
                del target[field]
            else:
                target[field] = value

    return edit


_DROP = object()


def _plus(k: int):
    return lambda v: v + k


#: case -> (edit of meta.json, message, whether load_partition alone notices it)
META_EDITS = {
    "train-global-x10": (
        _edit(num_train_global=lambda v: 10 * v),
        r"num_train_global is \d+ but the parts' num_train add up to \d+",
        True,
    ),
    "classes-up": (
        _edit(num_classes=_plus(1)),
        r"num_classes is 5 but the largest label in any part is 3 \(expected 4",
        False,
    ),
    "classes-down": (_edit(num_classes=_plus(-1)), r"num_classes is 3 but .*holds label 3", True),
    "features": (_edit(num_features=_plus(1)), r"num_features is 13 but .*x\.npy has shape", True),
    "inner-moved": (
        _edit(parts__1__num_inner=_plus(1), parts__2__num_inner=_plus(-1)),
        r"parts\[1\]\.num_inner is \d+ but part-1/indptr\.npy has",
        True,
    ),
    "inner-sum": (_edit(parts__1__num_inner=_plus(1)), r"num_nodes is 600 but .* add up", True),
    "halo": (_edit(parts__1__num_halo=_plus(1)), r"parts\[1\]\.num_halo is \d+ but", True),
    "edges-moved": (
        _edit(parts__0__num_edges=_plus(-1), parts__1__num_edges=_plus(1)),
        r"parts\[0\]\.num_edges is \d+ but part-0/indices\.npy stores",
        True,
    ),
    "edges-total": (_edit(num_edges=_plus(2)), r"num_edges is \d+ but the parts'", True),
    "train-moved": (
        _edit(parts__1__num_train=_plus(1), parts__2__num_train=_plus(-1)),
        r"parts\[1\]\.num_train is \d+ but part-1/train_mask\.npy marks",
        True,
    ),
    "send": (_edit(parts__0__num_send=_plus(1)), r"parts\[0\]\.num_send is", True),
    "rank": (_edit(parts__3__rank=2), r"parts\[3\]\.rank is 2, expected 3", True),
    "num-parts": (_edit(num_parts=3), r"describes 4 parts but num_parts is 3", True),
    "num-nodes": (_edit(num_nodes=_plus(1)), r"num_nodes is 601 but the parts' num_inner", True),
    "edge-cut": (_edit(edge_cut=_plus(1)), r"edge_cut is \d+ but the parts store \d+", False),
    "edge-cut-huge": (_edit(edge_cut=10**9), r"edge_cut 1000000000 exceeds num_edges", True),
    "bool": (_edit(num_classes=True), r"num_classes must be an integer, got True", True),
    "negative": (_edit(num_train_global=-5), r"num_train_global is -5, must be at least 0", True),
    "float": (_edit(num_features=12.0), r"num_features must be an integer, got 12\.0", True),
    "string": (_edit(parts__0__num_inner="150"), r"parts\[0\]\.num_inner must be an integer", True),
    "field-missing": (_edit(parts__0__num_halo=_DROP), r"parts\[0\] lacks num_halo", True),
    "file-bytes": (_edit(files__bytes="x"), r"files\['part-0/x\.npy'\]\.bytes must be", True),
    "files-list": (_edit(files=[]), r"files must be a JSON object", True),
    "parts-number": (_edit(parts=4), r"parts must be a list of objects", True),
    "dataset": (_edit(dataset=5), r"dataset must be a string", True),
    "num-blocks": (_edit(num_blocks=_plus(1)), r"num_blocks is \d+ but the parts' num_bl", True),
    "block-key": (_edit(block_sha256=_DROP), r"has blocks but lacks block_sha256", True),
    "part-blocks": (
        _edit(parts__0__num_blocks=_plus(1), parts__1__num_blocks=_plus(-1)),
        r"parts\[0\]\.num_blocks is \d+ but part-0/block_ids\.npy has shape \[\d+\]",
        True,
    ),
}


@pytest.mark.parametrize("case", list(META_EDITS))
def test_meta_field_edits_are_caught(parts4, capsys, case):
    """meta.json edited (file checksums still valid): every count is checked against the arrays."""
    edit, message, by_load = META_EDITS[case]
    meta = json.loads((parts4 / "meta.json").read_text())
    edit(meta)
    (parts4 / "meta.json").write_text(json.dumps(meta))
    pattern = re.escape(str(parts4 / "meta.json")) + ".*" + message
    with pytest.raises(PartitionError, match=pattern):
        verify_partitions(parts4)
    if by_load:
        with pytest.raises(PartitionError, match=pattern):
            for rank in range(4):
                load_partition(parts4, rank)
    assert main(["verify", str(parts4)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fullgraph verify: error: ") and err.count("\n") == 1
    assert re.search(message, err) and "Traceback" not in err


@pytest.mark.parametrize(
    ("a", "b"), [("train_mask", "val_mask"), ("train_mask", "test_mask"), ("val_mask", "test_mask")]
)
def test_part_with_overlapping_masks(parts4, a, b):
    """A node in two splits of a part (files rewritten with valid checksums) is refused."""
    mask_a = np.load(parts4 / "part-1" / f"{a}.npy")
    mask_b = np.load(parts4 / "part-1" / f"{b}.npy")
    local = int(np.flatnonzero(mask_a)[0])
    mask_b[local] = True
    rewrite(parts4, f"part-1/{b}.npy", mask_b)
    node = int(np.load(parts4 / "part-1" / "global_ids.npy")[local])
    message = (
        f"part-1/{a}\\.npy: node {node} is in both the {a.removesuffix('_mask')} and the "
        f"{b.removesuffix('_mask')} split"
    )
    with pytest.raises(PartitionError, match=message):
        load_partition(parts4, 1)
    with pytest.raises(PartitionError, match=message):
        verify_partitions(parts4)


def test_meta_json_path_means_its_directory(small_partitions, tmp_path, capsys):
    meta = small_partitions[2] / "meta.json"
    assert load_partition(meta, 1).rank == 1
    assert verify_partitions(meta)["num_parts"] == 2
    assert main(["verify", str(meta)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {meta}: 2 parts")
    (tmp_path / "empty").mkdir()
    give = r"give the directory written by `fullgraph partition` \(or its meta\.json\)"
    for path, problem in (
        (small_partitions[2] / "part-0" / "x.npy", "is a file, not a partition directory"),
        (tmp_path / "nowhere" / "meta.json", "does not exist"),
        (tmp_path / "empty", "holds no meta.json"),
    ):
        with pytest.raises(PartitionError, match=f"{re.escape(problem)}.*{give}"):
            load_partition(path, 0)
        assert main(["verify", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and problem in err and "fullgraph partition" in err


@pytest.mark.parametrize("case", ["out-is-file", "out-under-file"])
def test_cli_partition_bad_out(small_graph, tmp_path, fake_load, capsys, case):
    (tmp_path / "f").write_text("keep\n")
    out = tmp_path / "f" if case == "out-is-file" else tmp_path / "f" / "parts"
    argv = ["partition", "--dataset", small_graph.name, "--root", str(tmp_path), "--parts", "2"]
    for force in ([], ["--force"]):
        assert main([*argv, "--out", str(out), *force]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fullgraph partition: error: --out ") and err.count("\n") == 1
        assert "is a file" in err or "already exists" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    assert (tmp_path / "f").read_text() == "keep\n"


@pytest.mark.parametrize("damage", ["past-inner", "negative"])
def test_damaged_send_index_is_refused_without_checksums(parts4, damage):
    """Issue 31: --no-verify ended in an IndexError deep in the first exchange."""
    key = "part-1/send_index.npy"
    index = np.load(parts4 / key)
    index[0] = 10**6 if damage == "past-inner" else -3
    np.save(parts4 / key, index)  # same size: only a checksum would notice
    with pytest.raises(PartitionError, match=r"send_index\.npy: entry 0 sends node"):
        load_partition(parts4, 1, verify_checksums=False)


@pytest.mark.parametrize(("key", "array"), [("global_ids", np.arange(3)), ("indptr", np.array(5))])
def test_a_short_array_never_reads_as_a_negative_count(parts4, key, array):
    rel = f"part-0/{key}.npy"
    rewrite(parts4, rel, array)
    meta = json.loads((parts4 / "meta.json").read_text())
    meta["files"][rel]["shape"] = list(array.shape)
    (parts4 / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError) as info:
        load_partition(parts4, 0)
    assert not re.search(r"(?<![\w\[])-\d", str(info.value)), info.value


def test_halo_counts_that_disagree_across_parts_are_refused(parts4):
    """Rows moved from one peer's count to another's keep every part's own invariants; only
    the peers' counts side by side show it (before: 3 ranks trained on misplaced rows, exit 0)."""
    from fullgraph.partition.load import check_peer_counts

    parts = [load_partition(parts4, r, verify_checksums=False) for r in range(4)]
    counts = [(np.diff(p.send_offsets).tolist(), np.diff(p.recv_offsets).tolist()) for p in parts]
    check_peer_counts(counts)
    sends, receives = counts[2]
    peers = [q for q in range(4) if q != 2 and receives[q] > 0]
    receives[peers[0]] += 1
    receives[peers[1]] -= 1  # the same halo rows in all: part 2's own checks still pass
    with pytest.raises(PartitionError, match=rf"part {peers[0]} sends .* rows to part 2 .* but "):
        check_peer_counts(counts)
