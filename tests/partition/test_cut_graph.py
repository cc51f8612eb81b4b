"""The receptive-field cut: breadth-first distances, the cut graph (whole-graph ids and degrees,
complete in-edges inside the hops, the splits kept), the partition's cut arrays and ``verify``,
and the bad input refused in one line.

Enters through :mod:`fullgraph.partition.receptive_cut`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from cli_run import assert_one_line, run_cli
from conftest import build_sbm_graph
from scipy.sparse.csgraph import shortest_path

from fullgraph.errors import ConfigError, DataError, PartitionError
from fullgraph.partition import load_partition, partition_graph, verify_partitions
from fullgraph.partition.blocks import node_blocks
from fullgraph.partition.receptive_cut import (
    MAX_CUT_HOPS,
    CutSpec,
    check_cut,
    cut_graph,
    hop_distance,
    seed_mask,
)


@pytest.fixture(scope="module")
def sparse_graph():
    """A sparse directed SBM graph with few training nodes: a 2-hop cut keeps part of it."""
    return build_sbm_graph(
        num_nodes=1500, avg_degree=2.0, train_fraction=0.03, directed=True, name="sparse-cut"
    )


def test_hop_distance_is_breadth_first_along_in_edges(sparse_graph) -> None:
    g = sparse_graph
    seeds = seed_mask(g, ("train",))
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    # an edge u -> v is row v, column u: from a seed to its sources, then theirs
    m = sp.csr_matrix((np.ones(g.num_edges), (rows, g.indices)), shape=(g.num_nodes,) * 2)
    want = shortest_path(m, unweighted=True, indices=np.flatnonzero(seeds)).min(axis=0)
    for hops in (1, 3):
        got = hop_distance(g, seeds, hops)
        expect = np.where(want <= hops, want, -1).astype(np.int64)
        assert np.array_equal(got, expect), hops


def test_the_cut_keeps_ids_degrees_and_every_in_edge_inside_the_hops(sparse_graph) -> None:
    g, hops = sparse_graph, 2
    cut = cut_graph(g, CutSpec(hops, ("train",)))
    sub, ids = cut.graph, cut.graph.node_ids
    dist = hop_distance(g, seed_mask(g, ("train",)), hops)
    assert np.array_equal(ids, np.flatnonzero(dist >= 0))  # ascending whole-graph ids
    assert 0 < sub.num_nodes < g.num_nodes
    assert np.array_equal(sub.in_degree(), g.in_degree()[ids])
    assert np.array_equal(sub.train_mask, g.train_mask[ids])
    assert not sub.val_mask.any() and not sub.test_mask.any()  # not the cut's splits
    for i, v in enumerate(ids):
        got = ids[sub.indices[sub.indptr[i] : sub.indptr[i + 1]]]
        whole = g.indices[g.indptr[v] : g.indptr[v + 1]]
        if dist[v] < hops:  # every in-edge kept, in its order
            assert np.array_equal(got, whole), v
        else:  # the in-edges from kept nodes only
            assert np.array_equal(got, whole[dist[whole] >= 0]), v
    record = cut.record
    assert record["num_nodes"] == sub.num_nodes and record["seeds"] == int(g.train_mask.sum())
    assert sum(record["nodes_per_hop"]) == sub.num_nodes
    assert record["dropped_splits"] == ["val", "test"]


def test_a_block_without_kept_nodes_keeps_a_placeholder(sparse_graph) -> None:
    g = sparse_graph
    blocks = node_blocks(g, block_size=64, seed=0)
    cut = cut_graph(g, CutSpec(1, ("train",)), blocks)
    assert cut.blocks is not None and cut.record["placeholders"] > 0
    kept = np.bincount(cut.blocks.block, minlength=blocks.num_blocks)
    assert kept.min() >= 1 and cut.blocks.num_blocks == blocks.num_blocks
    # positions: each kept node's rank within its whole-graph block (ascending ids)
    for b in range(blocks.num_blocks):
        members = np.flatnonzero(blocks.block == b)
        mine = cut.graph.node_ids[cut.blocks.block == b]
        assert np.array_equal(
            cut.blocks.position[cut.blocks.block == b], np.searchsorted(members, mine)
        )
    assert np.array_equal(cut.blocks.full_rows, blocks.sizes())


@pytest.mark.parametrize("assign", ["blocks", "kway"])
def test_a_cut_partition_verifies_and_records_the_cut(sparse_graph, tmp_path, assign) -> None:
    out = tmp_path / "parts"
    meta = partition_graph(sparse_graph, 2, out, assign=assign, cut=CutSpec(2, ("train",)))
    assert meta["cut"]["hops"] == 2 and meta["num_nodes"] == meta["cut"]["num_nodes"]
    summary = verify_partitions(out, sparse_graph)
    assert summary["against_graph"]
    verify_partitions(out)
    part = load_partition(out, 1)
    assert part.node_ids is not None and part.node_ids.shape == part.global_ids.shape
    assert (part.block_pos is not None) == (assign == "blocks")


def test_verify_finds_a_changed_cut(sparse_graph, tmp_path) -> None:
    out = tmp_path / "parts"
    partition_graph(sparse_graph, 2, out, cut=CutSpec(2, ("train",)))
    meta = json.loads((out / "meta.json").read_text())
    meta["cut"]["node_ids_sha256"] = "0" * 64
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="node_ids"):
        verify_partitions(out)
    other = build_sbm_graph(num_nodes=1500, avg_degree=2.0, train_fraction=0.03, seed=5)
    with pytest.raises(PartitionError):
        verify_partitions(out, other)


@pytest.mark.parametrize(
    ("hops", "splits", "match"),
    [
        (0, None, "at least 1"),
        (-2, None, "at least 1"),
        (MAX_CUT_HOPS + 1, None, "exceeds"),
        (1.5, None, "integer"),
        (2, "train,nodes", "unknown split 'nodes'"),
        (2, " , ", "no split"),
    ],
)
def test_bad_cuts_are_one_line(hops, splits, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        check_cut(hops, splits)
    assert "\n" not in str(info.value)


def test_a_cut_of_no_labelled_nodes_is_refused(sparse_graph) -> None:
    g = build_sbm_graph(num_nodes=200, train_fraction=0.0)
    with pytest.raises(DataError, match="holds no node"):
        cut_graph(g, CutSpec(2, ("train",)))
    assert check_cut(2, "val,train,val").splits == ("val", "train")


def test_the_command_line_cut(tmp_path, capsys) -> None:
    root = tmp_path / "data"
    code, _, err = run_cli(
        ["data", "synth", "--preset", "tiny", "--name", "tiny", "--root", str(root)], capsys
    )
    assert code == 0, err
    base = ["partition", "--dataset", "tiny", "--root", str(root), "--parts", "2"]
    code, _, err = run_cli([*base, "--out", str(tmp_path / "a"), "--cut-splits", "train"], capsys)
    assert_one_line(code, err, "--cut-splits needs --cut-hops")
    code, _, err = run_cli([*base, "--out", str(tmp_path / "b"), "--cut-hops", "0"], capsys)
    assert_one_line(code, err, "--cut-hops must be at least 1")
    assert not (tmp_path / "b").exists()
    out = tmp_path / "c"
    code, text, err = run_cli([*base, "--out", str(out), "--cut-hops", "1"], capsys)
    assert code == 0, err
    assert "receptive-field cut: 1 hop of train/val/test" in text
    assert json.loads((out / "meta.json").read_text())["cut"]["hops"] == 1
