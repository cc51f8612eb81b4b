"""Edge weights and edge feature rows stay with their edges through every loader operation.

:func:`edges_to_csr_with_values` (self-loops dropped with their values, the reverse edge given
the forward edge's values, duplicates merged only when their values agree), the OGB layout's
``edge_weight.csv.gz`` / ``edge_feat.csv.gz`` written by :func:`write_ogb` and read back (also
from the processed cache), the PyG converters, and NaN refused.

Enters through :mod:`fullgraph.datasets.edges`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fullgraph.datasets import Graph, from_pyg, to_pyg
from fullgraph.datasets.edges import csr_to_edges, edges_to_csr_with_values
from fullgraph.datasets.ogb import read_ogb
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic import with_edge_values
from fullgraph.errors import DataError


def _edge_map(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray) -> dict:
    src, dst = csr_to_edges(indptr, indices)
    return {
        (int(u), int(v)): values[e].tolist() for e, (u, v) in enumerate(zip(src, dst, strict=True))
    }


def test_values_follow_their_edges_through_symmetrisation_and_dedupe() -> None:
    src = np.array([0, 1, 2, 2, 3, 1])
    dst = np.array([1, 2, 2, 0, 1, 0])  # 2 -> 2 is a self-loop; 1 -> 0 repeats 0 -> 1's value
    weight = np.array([0.5, 2.0, 9.0, 1.5, 3.0, 0.5], dtype=np.float32)
    attr = np.arange(12, dtype=np.float32).reshape(6, 2)
    attr[5] = attr[0]
    indptr, indices, out = edges_to_csr_with_values(
        src, dst, 4, {"edge_weight": weight, "edge_attr": attr}
    )
    got = _edge_map(indptr, indices, out["edge_weight"])
    assert got == {
        (0, 1): 0.5,
        (1, 0): 0.5,
        (1, 2): 2.0,
        (2, 1): 2.0,
        (2, 0): 1.5,
        (0, 2): 1.5,
        (3, 1): 3.0,
        (1, 3): 3.0,
    }
    rows = _edge_map(indptr, indices, out["edge_attr"])
    assert rows[(2, 0)] == rows[(0, 2)] == [6.0, 7.0]
    assert out["edge_attr"].shape == (8, 2)
    # the row order is the CSR's: sources ascending within a row
    for v in range(4):
        assert np.all(np.diff(indices[indptr[v] : indptr[v + 1]]) > 0)


def test_directed_keeps_both_directions_and_loops_when_asked() -> None:
    indptr, indices, out = edges_to_csr_with_values(
        np.array([0, 1, 2]),
        np.array([1, 0, 2]),
        3,
        {"edge_weight": np.array([1.0, 4.0, 7.0])},
        symmetric=False,
        remove_self_loops=False,
    )
    assert _edge_map(indptr, indices, out["edge_weight"]) == {(0, 1): 1.0, (1, 0): 4.0, (2, 2): 7.0}


def test_conflicting_values_of_one_edge_are_refused() -> None:
    with pytest.raises(DataError, match=r"edge 1 -> 0 is given more than once with different"):
        edges_to_csr_with_values(
            np.array([0, 1]), np.array([1, 0]), 2, {"edge_weight": np.array([1.0, 2.0])}
        )


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_edge_values_are_refused(bad: float, make_graph) -> None:
    with pytest.raises(DataError, match="NaN or infinite values on 1 edges"):
        edges_to_csr_with_values(
            np.array([0, 1]), np.array([1, 2]), 3, {"edge_weight": np.array([1.0, bad])}
        )
    g = with_edge_values(make_graph(num_nodes=40), edge_dim=2)
    g.edge_attr[3, 1] = bad
    with pytest.raises(DataError, match="edge_attr holds NaN or infinite values"):
        g.validate()


@pytest.fixture
def weighted(make_graph) -> Graph:
    return with_edge_values(make_graph(num_nodes=60, num_isolated=2), edge_dim=3, seed=1)


@pytest.mark.parametrize("cache", [False, True])
def test_ogb_layout_round_trip(weighted: Graph, tmp_path, cache: bool) -> None:
    write_ogb(weighted, tmp_path, "weighted")
    raw = tmp_path / "weighted" / "raw"
    assert (raw / "edge_weight.csv.gz").is_file() and (raw / "edge_feat.csv.gz").is_file()
    for _ in range(2 if cache else 1):  # the second read comes from the processed cache
        g = read_ogb(tmp_path, "weighted", cache=cache)
        np.testing.assert_array_equal(g.indptr, weighted.indptr)
        np.testing.assert_array_equal(g.indices, weighted.indices)
        np.testing.assert_array_equal(g.edge_weight, weighted.edge_weight)
        np.testing.assert_array_equal(g.edge_attr, weighted.edge_attr)


def test_ogb_edge_feat_alone_and_a_short_file(weighted: Graph, tmp_path) -> None:
    from dataclasses import replace

    write_ogb(replace(weighted, edge_weight=None), tmp_path, "feat")
    g = read_ogb(tmp_path, "feat", cache=False)
    assert g.edge_weight is None and g.edge_dim == 3
    np.testing.assert_array_equal(g.edge_attr, weighted.edge_attr)
    import gzip

    path = tmp_path / "feat" / "raw" / "edge_feat.csv.gz"
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(lines[:-1])))
    with pytest.raises(DataError, match=r"edge_feat.csv.gz: \d+ rows but num-edge-list says"):
        read_ogb(tmp_path, "feat", cache=False)


def test_asymmetric_values_are_written_directed(weighted: Graph, tmp_path) -> None:
    from dataclasses import replace

    w = np.arange(weighted.num_edges, dtype=np.float32)  # u -> v and v -> u differ
    g = replace(weighted, edge_weight=w, edge_attr=None)
    write_ogb(g, tmp_path, "directed")
    back = read_ogb(tmp_path, "directed", symmetric=False, cache=False)
    np.testing.assert_array_equal(back.edge_weight, w)
    with pytest.raises(DataError, match="different edge_weight values"):
        read_ogb(tmp_path, "directed", cache=False)  # symmetrising would merge them


def test_pyg_converters_carry_edge_values(weighted: Graph) -> None:
    pytest.importorskip("torch_geometric")
    data = to_pyg(weighted)
    assert data.edge_weight.shape == (weighted.num_edges,)
    back = from_pyg(data, "back")
    np.testing.assert_array_equal(back.edge_weight, weighted.edge_weight)
    np.testing.assert_array_equal(back.edge_attr, weighted.edge_attr)
    perm = np.random.default_rng(0).permutation(weighted.num_edges)  # any edge order
    data.edge_index = data.edge_index[:, perm]
    data.edge_weight, data.edge_attr = data.edge_weight[perm], data.edge_attr[perm]
    again = from_pyg(data, "again")
    np.testing.assert_array_equal(again.edge_weight, weighted.edge_weight)
    np.testing.assert_array_equal(again.edge_attr, weighted.edge_attr)


def test_gnn_benchmark_weighted_adjacency(tmp_path) -> None:
    from test_npz_arrays import benchmark_arrays, write_benchmark

    from fullgraph.datasets import load

    arrays = benchmark_arrays()
    arrays["adj_data"] = np.arange(1, 7, dtype=np.float32)  # ring edge v -> v + 1 weighs v + 1
    write_benchmark(tmp_path, arrays)
    g = load("amazon-photo", tmp_path)
    src, dst = csr_to_edges(g.indptr, g.indices)
    got = dict(
        zip(zip(src.tolist(), dst.tolist(), strict=True), g.edge_weight.tolist(), strict=True)
    )
    assert got[(0, 1)] == got[(1, 0)] == 1.0 and got[(5, 0)] == got[(0, 5)] == 6.0
    # the ring's weight-ones file (every real gnn-benchmark graph is binary) has no weights
    assert load("amazon-photo", _binary(tmp_path)).edge_weight is None


def _binary(root):
    from test_npz_arrays import benchmark_arrays, write_benchmark

    write_benchmark(root / "binary", benchmark_arrays())
    return root / "binary"


def test_data_synth_draws_edge_values(tmp_path, capsys) -> None:
    from fullgraph.cli import main
    from fullgraph.datasets import load

    argv = ["data", "synth", "--name", "ew", "--root", str(tmp_path)]
    assert main([*argv, "--edge-weight", "--edge-dim", "2"]) == 0
    g = load("ew", tmp_path)
    assert g.edge_weight is not None and g.edge_dim == 2
    assert g.edge_weight.min() >= 0.5 and g.edge_weight.max() <= 2.0
    capsys.readouterr()
    assert main(["data", "info", "--dataset", "ew", "--root", str(tmp_path)]) == 0
    assert "edge values  weights, 2 features per edge" in capsys.readouterr().out
