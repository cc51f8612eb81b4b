"""METIS through a shared libmetis (32-bit indices): binding, library choice, errors."""

from __future__ import annotations

import numpy as np
import pytest

from fullgraph.cli import main
from fullgraph.errors import ConfigError, PartitionError
from fullgraph.partition import assign_parts, libmetis, partition_graph, verify_partitions
from fullgraph.partition.assign import imbalance, symmetric_adjacency

LIB = libmetis.find_libmetis()
needs_lib = pytest.mark.skipif(
    LIB is None, reason="no libmetis (make install unpacks Debian's libmetis5 into .venv/lib)"
)


@pytest.fixture
def fresh_search(monkeypatch):
    """Forget the cached library search before and after the test (it reads the environment)."""
    libmetis.find_libmetis.cache_clear()
    yield monkeypatch
    libmetis.find_libmetis.cache_clear()


def cut_edges(graph, owner: np.ndarray) -> int:
    """Directed edges whose endpoints have different owners."""
    src = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return int((owner[src] != owner[graph.indices]).sum())


@needs_lib
def test_width_is_measured():
    assert LIB.bits in (32, 64)
    assert np.dtype(LIB.idx).itemsize * 8 == LIB.bits
    assert str(LIB.bits) in LIB.describe()


@needs_lib
@pytest.mark.parametrize("recursive", [False, True])
def test_part_graph_on_a_path_and_triangle_pair(recursive):
    # two triangles joined by one edge: the best 2-way cut is that edge
    edges = [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)]
    n = 6
    adj = [[] for _ in range(n)]
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    xadj = np.cumsum([0] + [len(a) for a in adj]).astype(LIB.idx)
    adjncy = np.concatenate([sorted(a) for a in adj]).astype(LIB.idx)
    w = np.ones(n, dtype=LIB.idx)
    part = libmetis.part_graph(LIB, 2, xadj, adjncy, w, 1, 0, recursive)
    assert part.dtype == np.int64 and part.shape == (n,)
    assert len(set(part[:3])) == 1 and len(set(part[3:])) == 1 and part[0] != part[3]


@needs_lib
def test_part_graph_checks_types_and_reports_errors():
    xadj = np.array([0, 1, 2], dtype=np.float64)
    adjncy = np.array([1, 0], dtype=LIB.idx)
    w = np.ones(2, dtype=LIB.idx)
    with pytest.raises(PartitionError, match="xadj must be C-contiguous"):
        libmetis.part_graph(LIB, 2, xadj, adjncy, w, 1, 0, False)
    with pytest.raises(PartitionError, match="erroneous input"):  # 0 parts
        libmetis.part_graph(LIB, 0, xadj.astype(LIB.idx), adjncy, w, 1, 0, False)


@needs_lib
@pytest.mark.parametrize("num_parts", [2, 4, 8])
def test_libmetis_matches_pymetis_quality(make_graph, num_parts):
    graph = make_graph(num_nodes=2000, seed=3)
    notes_lib: list[str] = []
    notes_py: list[str] = []
    lib = assign_parts(graph, num_parts, seed=0, metis="libmetis", notes=notes_lib)
    py = assign_parts(graph, num_parts, seed=0, metis="pymetis", notes=notes_py)
    assert notes_lib[0] == f"metis: {LIB.describe()}"
    assert notes_py[0] == "metis: pymetis (64-bit idx_t)"
    assert np.array_equal(lib, assign_parts(graph, num_parts, seed=0, metis="libmetis"))
    assert set(lib.tolist()) == set(range(num_parts))
    for weights in (np.ones(graph.num_nodes), graph.in_degree(), graph.train_mask):
        assert imbalance(lib, weights, num_parts) <= 1.1  # every constraint balanced
    # a METIS cut: far below a random split's (METIS 5.1 and 5.2 trade cut and balance
    # differently, so the two libraries' cuts are not compared with each other)
    random = assign_parts(graph, num_parts, method="random", seed=0)
    for owner in (lib, py):
        assert cut_edges(graph, owner) < 0.6 * cut_edges(graph, random)


@needs_lib
def test_partition_with_libmetis_verifies(small_graph, tmp_path):
    meta = partition_graph(small_graph, 4, tmp_path / "p", metis="libmetis")
    assert f"metis: {LIB.describe()}" in meta["report"]["notes"]
    verify_partitions(tmp_path / "p", small_graph)


def test_auto_without_a_library_uses_pymetis(small_graph, fresh_search):
    fresh_search.setenv(libmetis.ENV_VAR, "off")
    assert libmetis.find_libmetis() is None
    notes: list[str] = []
    owner = assign_parts(small_graph, 2, notes=notes)
    assert notes[0] == "metis: pymetis (64-bit idx_t)"
    assert set(owner.tolist()) == {0, 1}
    with pytest.raises(ConfigError, match="no METIS shared library found"):
        assign_parts(small_graph, 2, metis="libmetis")


def test_explicit_library_that_does_not_load(fresh_search, tmp_path):
    bogus = tmp_path / "libmetis.so"
    bogus.write_bytes(b"not a library")
    fresh_search.setenv(libmetis.ENV_VAR, str(bogus))
    with pytest.raises(PartitionError, match="not a usable METIS 5 library"):
        libmetis.find_libmetis()
    with pytest.raises(PartitionError, match="not a usable METIS 5 library"):
        libmetis.load_libmetis("/usr/lib/x86_64-linux-gnu/libm.so.6")


def test_unknown_library_name(small_graph):
    with pytest.raises(ConfigError, match="unknown METIS library 'kahip'"):
        assign_parts(small_graph, 2, metis="kahip")


def test_graph_too_large_for_32_bit_indices():
    lib32 = libmetis.LibMetis(path="x", lib=None, idx=np.int32)  # type: ignore[arg-type]
    assert libmetis.fits(lib32, 2**31 - 1, [10, 20])
    assert not libmetis.fits(lib32, 2**31, [10, 20])
    assert not libmetis.fits(lib32, 100, [2**31])
    lib64 = libmetis.LibMetis(path="x", lib=None, idx=np.int64)  # type: ignore[arg-type]
    assert libmetis.fits(lib64, 2**40, [2**40])


def test_symmetric_input_is_what_metis_reads(small_graph):
    xadj, adjncy = symmetric_adjacency(small_graph)
    as32 = libmetis.as_idx(adjncy, np.int32)
    assert as32.dtype == np.int32 and as32.flags.c_contiguous and np.array_equal(as32, adjncy)
    assert libmetis.as_idx(as32, np.int32) is as32


def test_cli_libmetis_missing_is_one_line(fresh_search, tmp_path, capsys):
    fresh_search.setenv(libmetis.ENV_VAR, "off")
    argv = ["partition", "--dataset", "cora", "--root", str(tmp_path), "--parts", "2"]
    assert main([*argv, "--metis", "libmetis", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no METIS shared library found" in err[0]
    assert not (tmp_path / "o").exists()
