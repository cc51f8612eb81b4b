"""Partitioning a memory-mapped graph: the same files as from memory, and no copies on the way.

Enters through :mod:`fullgraph.partition.build`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from fullgraph.datasets import load
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import generate
from fullgraph.partition import (
    build,
    npy_files,
    partition_graph,
    symmetric_adjacency,
    verify_partitions,
)
from fullgraph.resources import drop_resident_pages


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mmap-data")
    write_ogb(generate("tiny", seed=2), root, "synth-tiny")
    load("synth-tiny", root)  # parses and writes the processed cache
    return root


def files_of(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*.npy"))}


def meta_without_timings(path: Path) -> dict:
    meta = json.loads((path / "meta.json").read_text())
    for key in ("stages", "total_seconds", "peak_rss_mb"):
        meta["report"].pop(key)
    return meta


@pytest.mark.parametrize("method", ["metis", "random"])
def test_mmapped_graph_gives_the_same_partition_byte_for_byte(tiny_root, tmp_path, method):
    in_memory = load("synth-tiny", tiny_root)
    mapped = load("synth-tiny", tiny_root, mmap=True)
    assert isinstance(mapped.indices, np.memmap) and not isinstance(in_memory.indices, np.memmap)
    partition_graph(in_memory, 3, tmp_path / "a", method=method, seed=1)
    partition_graph(mapped, 3, tmp_path / "b", method=method, seed=1)
    a, b = files_of(tmp_path / "a"), files_of(tmp_path / "b")
    arrays = 12 + 2 * (method == "metis")  # METIS's default assignment adds the block arrays
    assert len(a) == 3 * arrays and a == b
    assert meta_without_timings(tmp_path / "a") == meta_without_timings(tmp_path / "b")
    verify_partitions(tmp_path / "b", in_memory)


def test_parts_streamed_in_small_chunks_are_unchanged(tiny_root, tmp_path, monkeypatch):
    graph = load("synth-tiny", tiny_root, mmap=True)
    partition_graph(graph, 2, tmp_path / "a", seed=1)
    monkeypatch.setattr(build, "CHUNK_ELEMENTS", 37)  # many blocks of edges and feature rows
    partition_graph(graph, 2, tmp_path / "b", seed=1)
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")


@pytest.mark.parametrize(
    "array",
    [
        np.arange(7, dtype=np.int64),
        np.zeros((5, 0), dtype=np.float32),
        np.ones((4, 3), dtype=np.float32),
        np.array([True, False]),
        np.zeros(0, dtype=np.int64),
    ],
)
def test_npy_header_is_what_np_save_writes(array):
    buf = io.BytesIO()
    np.save(buf, array)
    header = npy_files.npy_header(array.shape, array.dtype)
    assert buf.getvalue() == header + array.tobytes()


def test_symmetric_graph_goes_to_metis_without_a_copy(tiny_root):
    graph = load("synth-tiny", tiny_root, mmap=True)
    xadj, adjncy = symmetric_adjacency(graph)
    assert np.shares_memory(xadj, graph.indptr) and np.shares_memory(adjncy, graph.indices)


def test_resident_pages_are_dropped_only_for_read_only_maps(tiny_root, tmp_path):
    graph = load("synth-tiny", tiny_root, mmap=True)
    before = graph.indices.copy()
    assert drop_resident_pages(graph.indices)
    assert np.array_equal(graph.indices, before)  # read back from the page cache
    assert not drop_resident_pages(before)  # an in-memory array is left alone
    np.save(tmp_path / "w.npy", before)
    writable = np.load(tmp_path / "w.npy", mmap_mode="r+")
    assert not drop_resident_pages(writable)


def test_symmetry_check_rejects_every_kind_of_asymmetry() -> None:
    from fullgraph.partition.assign import _is_simple_symmetric

    def check(rows: list[list[int]]) -> bool:
        indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        indices = np.array([v for r in rows for v in r], dtype=np.int64)
        return bool(_is_simple_symmetric(indptr, indices))

    assert check([[1, 2], [0], [0], []])
    assert not check([[1, 2], [0], [], []])  # 0 -> 2 without 2 -> 0
    assert not check([[2, 1], [0], [0], []])  # unsorted row
    assert not check([[1, 1], [0, 0], [], []])  # duplicate edge
    assert not check([[0, 1], [0], [], []])  # self-loop
    assert not check([[1], [0, 2], [3], [2]])  # 1 -> 2 without 2 -> 1 (degrees differ)
    assert not check([[1], [2], [0]])  # a directed cycle: every degree matches
