"""Bad input around partitions: corruption, truncation, overwrite, failures midway, bad P, CLI."""

from __future__ import annotations

import json
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
