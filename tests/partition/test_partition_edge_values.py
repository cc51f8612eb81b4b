"""Edge weights and edge feature rows through ``partition``, ``load`` and ``verify``.

Every edge is stored once, by the part owning its target, aligned with the part's ``indices``;
``in_weight`` holds every local node's GLOBAL weighted in-degree. Checked without the verifier
(against the graph's edges), then the verifier's own checks: a changed value, values permuted
within a part (misaligned), a corrupted file, a graph with other values, NaN refused at
partition time, and a partition without edge values still loading.

Enters through :mod:`fullgraph.partition.build` and :mod:`fullgraph.partition.load`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_partition_errors import rewrite

from fullgraph.datasets import Graph
from fullgraph.datasets.edges import csr_to_edges
from fullgraph.datasets.synthetic import with_edge_values
from fullgraph.errors import ConfigError, DataError, PartitionError
from fullgraph.partition import (
    load_partition,
    partition_graph,
    read_meta,
    verify_partitions,
    whole_graph_part,
)


@pytest.fixture(scope="module")
def weighted(small_graph: Graph) -> Graph:
    return with_edge_values(small_graph, edge_dim=3, seed=2)


@pytest.fixture(scope="module")
def weighted_parts(weighted: Graph, tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("edge-parts")
    out = {}
    for P in (2, 4):
        out[P] = root / f"p{P}"
        partition_graph(weighted, P, out[P], method="metis", seed=0)
    return out


def _by_edge(src: np.ndarray, dst: np.ndarray, values: np.ndarray) -> dict:
    return {
        (int(u), int(v)): values[e].tolist() for e, (u, v) in enumerate(zip(src, dst, strict=True))
    }


@pytest.mark.parametrize("P", [2, 4])
def test_every_edge_once_with_its_target_and_aligned(weighted, weighted_parts, P) -> None:
    meta, _ = read_meta(weighted_parts[P])
    assert meta["edge_weight"] is True and meta["edge_dim"] == 3
    src, dst = csr_to_edges(weighted.indptr, weighted.indices)
    want_w = _by_edge(src, dst, weighted.edge_weight)
    want_a = _by_edge(src, dst, weighted.edge_attr)
    got_w, got_a = {}, {}
    in_weight = weighted.in_weight()
    for r in range(P):
        p = load_partition(weighted_parts[P], r)
        gsrc = p.global_ids[p.indices]
        gdst = np.repeat(p.global_ids[: p.num_inner], np.diff(p.indptr))
        for k, v in _by_edge(gsrc, gdst, p.edge_weight).items():
            assert k not in got_w, f"edge {k} stored twice"
            got_w[k] = v
        got_a.update(_by_edge(gsrc, gdst, p.edge_attr))
        np.testing.assert_array_equal(p.in_weight, in_weight[p.global_ids])
        assert p.in_weight.dtype == np.float64 and p.edge_attr.dtype == np.float32
    assert got_w == want_w
    assert got_a == want_a
    assert verify_partitions(weighted_parts[P], weighted)["against_graph"]


#: The arrays of a :class:`~fullgraph.partition.Partition`, compared by value and dtype.
WHOLE_ARRAYS = (
    "global_ids", "indptr", "indices", "in_degree", "x", "y", "train_mask", "val_mask",
    "test_mask", "send_index", "send_offsets", "recv_offsets", "edge_weight", "in_weight",
    "edge_attr", "block_ids", "block_rows", "block_ptr",
)  # fmt: skip


def test_whole_graph_part_is_the_one_part_partition(weighted, tmp_path) -> None:
    """One process's part is ``fullgraph partition --parts 1``'s, array for array (rows in
    block order, edge values permuted with them); ``order="global"`` keeps the graph's."""
    partition_graph(weighted, 1, tmp_path / "p1", seed=0)
    want = load_partition(tmp_path / "p1", 0, mmap=False)
    got = whole_graph_part(weighted)
    assert not np.array_equal(got.global_ids, np.arange(weighted.num_nodes))  # a real permutation
    for name in WHOLE_ARRAYS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (got.num_blocks, got.num_inner, got.num_halo) == (want.num_blocks, want.num_inner, 0)
    flat = whole_graph_part(weighted, order="global")
    np.testing.assert_array_equal(flat.global_ids, np.arange(weighted.num_nodes))
    np.testing.assert_array_equal(flat.edge_weight, weighted.edge_weight)
    np.testing.assert_array_equal(flat.edge_attr, weighted.edge_attr)
    np.testing.assert_array_equal(flat.in_weight, weighted.in_weight())
    np.testing.assert_array_equal(flat.x[got.global_ids], got.x)
    with pytest.raises(ConfigError, match="order must be one of blocks, global"):
        whole_graph_part(weighted, order="rows")


@pytest.fixture
def parts2(weighted_parts, tmp_path) -> Path:
    return Path(shutil.copytree(weighted_parts[2], tmp_path / "p2"))


def test_a_changed_weight_is_caught(parts2, weighted) -> None:
    w = np.load(parts2 / "part-1" / "edge_weight.npy")
    w[5] += 1.0
    rewrite(parts2, "part-1/edge_weight.npy", w)
    with pytest.raises(PartitionError, match=r"part-1: in_weight of node \d+ is not the sum"):
        verify_partitions(parts2)


def test_misaligned_features_are_caught(parts2, weighted) -> None:
    a = np.load(parts2 / "part-0" / "edge_attr.npy")
    rewrite(parts2, "part-0/edge_attr.npy", a[::-1].copy())  # same rows, other edges
    verify_partitions(parts2)  # internally consistent: only the source graph tells
    with pytest.raises(PartitionError, match=r"part-0: edge_attr of an incoming edge of node"):
        verify_partitions(parts2, weighted)


def test_a_corrupted_file_and_another_graph_are_caught(parts2, weighted) -> None:
    other = replace(weighted, edge_weight=weighted.edge_weight * 2)
    with pytest.raises(PartitionError, match="in_weight differs from the source graph"):
        verify_partitions(parts2, other)
    unweighted = replace(weighted, edge_weight=None)
    with pytest.raises(PartitionError, match="edge_weight is True but the graph"):
        verify_partitions(parts2, unweighted)
    f = parts2 / "part-1" / "edge_attr.npy"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=r"part-1/edge_attr\.npy fails its sha256"):
        verify_partitions(parts2)


def test_a_wrong_shape_is_refused_on_load(parts2) -> None:
    rewrite(parts2, "part-0/edge_weight.npy", np.zeros(3, dtype=np.float32))
    meta = json.loads((parts2 / "meta.json").read_text())
    meta["files"]["part-0/edge_weight.npy"]["shape"] = [3]  # the file and meta.json agree
    (parts2 / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=r"edge_weight\.npy has shape \[3\], expected"):
        load_partition(parts2, 0)


def test_non_finite_values_are_refused_at_partition_time(weighted, tmp_path) -> None:
    w = weighted.edge_weight.copy()
    w[7] = np.nan
    with pytest.raises(DataError, match="edge_weight holds NaN or infinite values on 1 edges"):
        partition_graph(replace(weighted, edge_weight=w), 2, tmp_path / "p", method="random")
    assert not (tmp_path / "p").exists()


def test_old_partitions_without_edge_values_load(small_partitions, small_graph) -> None:
    meta = json.loads((small_partitions[2] / "meta.json").read_text())
    assert "edge_weight" not in meta and "edge_dim" not in meta
    p = load_partition(small_partitions[2], 0)
    assert p.edge_weight is None and p.edge_attr is None and p.in_weight is None
    verify_partitions(small_partitions[2], small_graph)
