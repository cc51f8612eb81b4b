"""Partition invariants (checked independently of ``verify_partitions``), fields and dtypes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fullgraph.datasets.graph import Graph
from fullgraph.partition import (
    FORMAT_VERSION,
    PART_ARRAYS,
    assign_parts,
    format_report,
    load_partition,
    partition_graph,
    read_meta,
    symmetric_adjacency,
    verify_partitions,
)
from fullgraph.partition.format import BLOCK_ARRAYS


def check_invariants(graph: Graph, path) -> None:
    """The DGL-style invariants, written out here without the library's verifier."""
    meta, _ = read_meta(path)
    n, num_parts = graph.num_nodes, meta["num_parts"]
    parts = [load_partition(path, r) for r in range(num_parts)]
    owner = np.full(n, -1)
    for p in parts:
        inner = p.global_ids[: p.num_inner]
        assert (owner[inner] == -1).all(), "a node is owned twice"
        owner[inner] = p.rank
    assert (owner >= 0).all(), "a node is owned by no part"

    deg = graph.in_degree()
    edges = []
    for p in parts:
        ni = p.num_inner
        halo = p.global_ids[ni:]
        # halo: foreign, grouped by owner ascending, matching recv_offsets
        assert (owner[halo] != p.rank).all()
        assert np.array_equal(owner[halo], np.repeat(np.arange(num_parts), np.diff(p.recv_offsets)))
        assert (np.diff(owner[halo]) >= 0).all()
        # local CSR: columns in range, every incoming edge of every inner node
        assert p.indices.min(initial=0) >= 0 and p.indices.max(initial=0) < p.num_local
        rows = np.repeat(p.global_ids[:ni], np.diff(p.indptr))
        edges.append(np.stack([p.global_ids[p.indices], rows], axis=1))
        assert np.array_equal(p.in_degree, deg[p.global_ids])
        inner = p.global_ids[:ni]
        x = np.zeros((n, 0), np.float32) if graph.x is None else graph.x
        assert np.array_equal(p.x, x[inner])
        assert np.array_equal(p.y, graph.y[inner])
        for m in ("train_mask", "val_mask", "test_mask"):
            assert np.array_equal(getattr(p, m), getattr(graph, m)[inner])
        # send lists: what r sends q is what q stores as halo from r, in q's order
        for q in parts:
            sent = p.global_ids[p.send_to(q.rank)]
            assert np.array_equal(sent, q.global_ids[q.halo_from(p.rank)])
            assert (p.send_to(q.rank) < ni).all()
    got = np.concatenate(edges)
    got = got[np.lexsort((got[:, 0], got[:, 1]))]
    dst = np.repeat(np.arange(n), deg)
    want = np.stack([graph.indices, dst], axis=1)
    want = want[np.lexsort((want[:, 0], want[:, 1]))]
    assert np.array_equal(got, want), "edges differ from the graph"
    assert meta["num_train_global"] == int(graph.train_mask.sum())
    assert meta["edge_cut"] == int((owner[graph.indices] != owner[dst]).sum())


@pytest.mark.parametrize("method", ["metis", "random", "contiguous"])
@pytest.mark.parametrize("num_parts", [1, 2, 4])
def test_invariants(small_graph, tmp_path, method, num_parts):
    out = tmp_path / "parts"
    meta = partition_graph(small_graph, num_parts, out, method=method, seed=3)
    check_invariants(small_graph, out)
    summary = verify_partitions(out, small_graph)
    assert summary["num_parts"] == num_parts
    assert summary["total_halo_rows"] == meta["report"]["rows_exchanged_per_layer"]


@pytest.mark.parametrize("kind", ["directed", "no-features", "self-loops"])
def test_invariants_other_graphs(make_graph, tmp_path, kind):
    if kind == "directed":
        graph = make_graph(num_nodes=300, directed=True, seed=1)
    elif kind == "no-features":
        graph = make_graph(num_nodes=300, num_features=0, seed=2)
    else:  # a graph that kept its self-loops: METIS must see them removed
        base = make_graph(num_nodes=200, seed=4)
        n = base.num_nodes
        dst = np.concatenate([np.repeat(np.arange(n), base.in_degree()), np.arange(n)])
        src = np.concatenate([base.indices, np.arange(n)])
        order = np.lexsort((src, dst))
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
        base.indptr, base.indices = indptr, src[order].astype(np.int64)
        graph = base.validate()
    partition_graph(graph, 3, tmp_path / "parts", method="metis")
    check_invariants(graph, tmp_path / "parts")
    verify_partitions(tmp_path / "parts", graph)


def test_symmetric_adjacency_drops_self_loops_and_directions(make_graph):
    g = make_graph(num_nodes=120, directed=True, seed=5)
    xadj, adjncy = symmetric_adjacency(g)
    n = g.num_nodes
    rows = np.repeat(np.arange(n), np.diff(xadj))
    assert (rows != adjncy).all()
    pairs = set(zip(rows.tolist(), adjncy.tolist(), strict=True))
    assert pairs == {(b, a) for a, b in pairs}
    dst = np.repeat(np.arange(n), g.in_degree())
    assert all((int(d), int(s)) in pairs for s, d in zip(g.indices, dst, strict=True))
    assert len(pairs) == adjncy.size  # no duplicates


def test_load_partition_fields_and_dtypes(small_graph, small_partitions):
    path = small_partitions[4]
    meta, meta_hash = read_meta(path)
    assert meta["format_version"] == FORMAT_VERSION
    for key in ("dataset", "num_nodes", "num_edges", "num_features", "num_classes", "method"):
        assert key in meta
    arrays = {**PART_ARRAYS, **BLOCK_ARRAYS}  # METIS's default assignment has blocks
    assert set(meta["files"]) == {f"part-{r}/{a}.npy" for r in range(4) for a in arrays}
    for rank in range(4):
        p = load_partition(path, rank)
        assert (p.rank, p.num_parts) == (rank, 4)
        for name, dtype in arrays.items():
            assert getattr(p, name).dtype == dtype, name
        assert isinstance(p.global_ids, np.memmap)
        assert p.global_ids.shape == (p.num_inner + p.num_halo,)
        assert p.indptr.shape == (p.num_inner + 1,)
        assert p.in_degree.shape == p.global_ids.shape
        assert p.x.shape == (p.num_inner, small_graph.num_features)
        assert p.send_offsets.shape == p.recv_offsets.shape == (5,)
        assert p.num_train_global == int(small_graph.train_mask.sum())
        assert (p.num_classes, p.num_features) == (small_graph.num_classes, 12)
        assert p.partition_hash == meta_hash
        assert p.meta["parts"][rank]["num_inner"] == p.num_inner
        assert "num_inner" in repr(p)
    p = load_partition(path, 2, mmap=False, verify_checksums=False)
    assert not isinstance(p.x, np.memmap)


def test_single_part_has_no_halo(small_graph, small_partitions):
    p = load_partition(small_partitions[1], 0)
    assert p.num_halo == 0 and p.num_inner == small_graph.num_nodes
    # every node once, in block order (ascending global id within a block)
    assert np.array_equal(np.sort(p.global_ids), np.arange(small_graph.num_nodes))
    local = np.empty(small_graph.num_nodes, dtype=np.int64)
    local[p.global_ids] = np.arange(p.num_inner)
    for row in (0, 17, small_graph.num_nodes - 1):  # a row's sources: the graph's, renamed
        v = int(p.global_ids[row])
        got = p.indices[p.indptr[row] : p.indptr[row + 1]]
        want = small_graph.indices[small_graph.indptr[v] : small_graph.indptr[v + 1]]
        assert np.array_equal(got, local[want])
    assert p.send_index.size == 0


def test_metis_beats_random_and_balances(make_graph, tmp_path):
    graph = make_graph(num_nodes=4000, num_blocks=8, avg_degree=10, p_in=0.95, seed=7)
    halo = {}
    for method in ("metis", "random"):
        meta = partition_graph(graph, 4, tmp_path / method, method=method, seed=0)
        halo[method] = meta["report"]["rows_exchanged_per_layer"]
        if method == "metis":
            imbalance = meta["report"]["imbalance"]
            assert max(imbalance.values()) <= 1.1, imbalance
    assert halo["metis"] < 0.5 * halo["random"], halo


def test_assign_parts_methods(small_graph):
    n = small_graph.num_nodes
    contiguous = assign_parts(small_graph, 4, method="contiguous")
    assert (np.diff(contiguous) >= 0).all() and np.bincount(contiguous).tolist() == [150] * 4
    random = assign_parts(small_graph, 4, method="random", seed=1)
    assert np.bincount(random).tolist() == [150] * 4
    assert np.array_equal(random, assign_parts(small_graph, 4, method="random", seed=1))
    assert not np.array_equal(random, assign_parts(small_graph, 4, method="random", seed=2))
    metis = assign_parts(small_graph, 4, method="metis", seed=0)
    assert metis.dtype == np.int64 and metis.shape == (n,) and set(metis.tolist()) == {0, 1, 2, 3}
    assert np.array_equal(metis, assign_parts(small_graph, 4, method="metis", seed=0))
    assert (assign_parts(small_graph, 1) == 0).all()


def test_report_in_meta_and_printed(small_partitions):
    meta = json.loads((small_partitions[4] / "meta.json").read_text())
    rep = meta["report"]
    assert set(rep["stages"]) == {"assign", "build_parts", "send_lists"}
    for stage in rep["stages"].values():
        assert stage["seconds"] >= 0 and stage["peak_rss_mb"] > 0
    assert rep["rows_exchanged_per_layer"] == sum(rep["halo_rows_per_part"])
    assert rep["halo_rows_per_part"] == [p["num_halo"] for p in meta["parts"]]
    assert rep["edge_cut"] == meta["edge_cut"] > 0
    assert set(rep["imbalance"]) == {"nodes", "train", "edges"}
    text = format_report(meta)
    assert "rows exchanged per layer" in text and "imbalance" in text and "stage assign" in text


def test_metis_fallback_is_logged(small_graph, monkeypatch, caplog):
    import pymetis

    real = pymetis.part_graph

    def picky(nparts, adjacency, *, vweights, **kwargs):
        if vweights.size == 3 * small_graph.num_nodes:
            raise RuntimeError("METIS_ERROR_INPUT (simulated)")
        return real(nparts, adjacency, vweights=vweights, **kwargs)

    monkeypatch.setattr(pymetis, "part_graph", picky)
    notes: list[str] = []
    with caplog.at_level("WARNING", logger="fullgraph.partition.assign"):
        owner = assign_parts(small_graph, 2, method="metis", notes=notes, metis="pymetis")
    assert set(owner.tolist()) == {0, 1}
    assert any("simulated" in n and "retrying with nodes + edges" in n for n in notes)
    assert "retrying with nodes + edges" in caplog.text


def test_metis_without_training_nodes(make_graph, tmp_path):
    graph = make_graph(num_nodes=300, seed=9, train_fraction=0.0)
    meta = partition_graph(graph, 2, tmp_path / "p")
    assert any("no training nodes" in n for n in meta["report"]["notes"])
    verify_partitions(tmp_path / "p", graph)
