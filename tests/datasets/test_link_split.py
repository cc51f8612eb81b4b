"""Seeded link splits (PyG RandomLinkSplit conventions), their OGB linkprop files and the
commands that write them: ``fullgraph data linksplit`` and ``data synth --preset collab |
citation2``, read back by ``load`` and ``load_link_split``.

Enters through :mod:`fullgraph.datasets.link_split`, :mod:`fullgraph.datasets.ogb_link_writer`
and :mod:`fullgraph.datasets.synthetic_link`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_run import assert_one_line, run_cli

from fullgraph.datasets import load, load_link_split
from fullgraph.datasets.edges import csr_to_edges
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.link_split import split_edges
from fullgraph.datasets.ogb_link_writer import write_ogb_link
from fullgraph.datasets.synthetic import with_edge_values, write_ogb
from fullgraph.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def graph(make_graph) -> Graph:
    g = make_graph(num_nodes=300, num_features=4, num_classes=3, seed=5, name="toy")
    return with_edge_values(g, edge_weight=True, seed=1)


def _pairs(g: Graph) -> set[tuple[int, int]]:
    src, dst = csr_to_edges(g.indptr, g.indices)
    return set(zip(src.tolist(), dst.tolist(), strict=True))


def _undirected(pairs: np.ndarray) -> set[tuple[int, int]]:
    return {(min(u, v), max(u, v)) for u, v in pairs.tolist()}


def test_every_edge_once_held_out_edges_leave_the_graph_both_ways(graph: Graph) -> None:
    mp, split = split_edges(graph, val=0.05, test=0.1, seed=3)
    m = graph.num_edges // 2
    assert len(split.edges["valid"]) == int(0.05 * m) and len(split.edges["test"]) == int(0.1 * m)
    parts = [_undirected(split.edges[s]) for s in ("train", "valid", "test")]
    assert sum(map(len, parts)) == m and set().union(*parts) == _undirected(
        np.array(sorted(_pairs(graph)))
    )
    train = parts[0]
    assert _pairs(mp) == train | {(v, u) for u, v in train}
    split.check_no_leak(mp.indptr, mp.indices)
    assert mp.x is graph.x and (mp.y == graph.y).all() and mp.num_classes == graph.num_classes
    assert not (mp.train_mask.any() or mp.val_mask.any() or mp.test_mask.any())
    # the weights follow their edges, in the graph and in the split
    weight = dict(zip(_pairs_list(graph), graph.edge_weight.tolist(), strict=True))
    for (u, v), w in zip(_pairs_list(mp), mp.edge_weight.tolist(), strict=True):
        assert weight[u, v] == w
    for (u, v), w in zip(split.edges["test"].tolist(), split.edge_weight["test"], strict=True):
        assert weight[u, v] == w
    assert split.metric == "auc" and split.undirected and not split.per_edge_negatives


def _pairs_list(g: Graph) -> list[tuple[int, int]]:
    src, dst = csr_to_edges(g.indptr, g.indices)
    return list(zip(src.tolist(), dst.tolist(), strict=True))


def test_negatives_are_distinct_non_edges_of_the_whole_graph(graph: Graph) -> None:
    _, split = split_edges(graph, val=20, test=30, seed=0, neg_ratio=2)
    whole = _undirected(np.array(sorted(_pairs(graph))))
    neg = np.concatenate([split.negatives["valid"], split.negatives["test"]])
    assert len(split.negatives["valid"]) == 40 and len(split.negatives["test"]) == 60
    keys = _undirected(neg)
    assert len(keys) == len(neg) and not keys & whole
    assert (neg[:, 0] != neg[:, 1]).all()


def test_per_edge_negatives_avoid_the_source_and_its_neighbours(graph: Graph) -> None:
    _, split = split_edges(graph, val=10, test=10, seed=0, neg_per_edge=50)
    assert split.per_edge_negatives and split.metric == "mrr"
    whole = _undirected(np.array(sorted(_pairs(graph))))
    for s in ("valid", "test"):
        assert split.negatives[s].shape == (10, 50)
        for (u, _), targets in zip(split.edges[s].tolist(), split.negatives[s], strict=True):
            assert u not in targets.tolist()
            assert not {(min(u, t), max(u, t)) for t in targets.tolist()} & whole


def test_seeded(graph: Graph) -> None:
    a = split_edges(graph, seed=1)[1]
    b = split_edges(graph, seed=1)[1]
    c = split_edges(graph, seed=2)[1]
    for s in ("train", "valid", "test"):
        np.testing.assert_array_equal(a.edges[s], b.edges[s])
    np.testing.assert_array_equal(a.negatives["test"], b.negatives["test"])
    assert not np.array_equal(a.edges["test"], c.edges["test"])


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"val": 0.0}, ConfigError, "--val 0.0"),
        ({"test": 1.5}, ConfigError, "--test 1.5"),
        ({"val": 0.5, "test": 0.5}, ConfigError, "none of the"),
        ({"val": 1e-4}, ConfigError, "holds out no edge"),
    ],
)
def test_impossible_sizes(graph: Graph, kwargs: dict, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle.replace(".", r"\.")):
        split_edges(graph, **kwargs)


def test_a_directed_graph_is_refused(make_graph) -> None:
    directed = make_graph(num_nodes=60, directed=True, seed=2)
    with pytest.raises(DataError, match="not an undirected graph"):
        split_edges(directed)


def test_written_and_read_back(graph: Graph, tmp_path: Path) -> None:
    mp, split = split_edges(graph, seed=4, neg_per_edge=7)
    write_ogb_link(mp, split, tmp_path, "toy-link")
    back = load("toy-link", tmp_path)
    np.testing.assert_array_equal(back.indptr, mp.indptr)
    np.testing.assert_array_equal(back.indices, mp.indices)
    np.testing.assert_array_equal(back.edge_weight, mp.edge_weight)
    np.testing.assert_array_equal(back.y, graph.y)
    np.testing.assert_allclose(back.x, graph.x, rtol=1e-6)
    assert back.num_classes == graph.num_classes
    read = load_link_split("toy-link", tmp_path)
    for s in ("train", "valid", "test"):
        np.testing.assert_array_equal(read.edges[s], split.edges[s])
    np.testing.assert_array_equal(read.negatives["valid"], split.negatives["valid"])
    assert read.metric == "mrr" and read.per_edge_negatives and read.undirected
    read.check_no_leak(back.indptr, back.indices)


def test_linksplit_command_and_force(graph: Graph, tmp_path: Path, capsys) -> None:
    src = tmp_path / "in"
    write_ogb(graph, src, "toy")
    out = tmp_path / "out"
    argv = ["data", "linksplit", "--dataset", "toy", "--root", str(src), "--out", str(out)]
    argv += ["--name", "toy-link", "--val", "0.1", "--test", "25", "--seed", "2"]
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0 and "metric auc" in stdout
    read = load_link_split("toy-link", out)
    _, expected = split_edges(load("toy", src), val=0.1, test=25, seed=2)
    np.testing.assert_array_equal(read.edges["test"], expected.edges["test"])
    np.testing.assert_array_equal(read.negatives["valid"], expected.negatives["valid"])
    marker = json.loads((out / "toy_link" / "meta.json").read_text())
    assert marker["task"] == "link" and marker["counts"]["test"] == 25
    code, stdout, _ = run_cli(["data", "info", "--dataset", "toy-link", "--root", str(out)], capsys)
    assert code == 0 and "link split   train" in stdout and "metric auc" in stdout
    code, _, err = run_cli(argv, capsys)  # exists, no --force
    assert code == 2 and "already exists" in err
    assert run_cli([*argv, "--force"], capsys)[0] == 0  # its own output: replaced
    # --force never replaces a node dataset, nor writes over its input
    code, _, err = run_cli([*argv[:-6], "--name", "toy", "--out", str(src), "--force"], capsys)
    assert_one_line(code, err, "the dataset directory")
    write_ogb(graph, out, "node-data")
    forced = [*argv[:7], str(out), "--name", "node-data", "--force"]
    code, _, err = run_cli(forced, capsys)
    assert_one_line(code, err, "is not a link dataset written by fullgraph")
    assert load("node-data", out).train_mask.any()  # untouched
    both = [*argv, "--neg-ratio", "2", "--neg-per-edge", "3", "--force"]
    assert_one_line(*run_cli(both, capsys)[::2], "give one")


@pytest.mark.parametrize(
    ("preset", "scale", "metric", "shape"),
    [("collab", 0.01, "hits@50", (1000, 2)), ("citation2", 0.001, "mrr", (87, 1000))],
)
def test_synth_link_presets(
    tmp_path: Path, capsys, preset: str, scale: float, metric: str, shape: tuple
) -> None:
    argv = ["data", "synth", "--preset", preset, "--scale", str(scale), "--name", "lp"]
    code, stdout, _ = run_cli([*argv, "--root", str(tmp_path)], capsys)
    assert code == 0, stdout
    split = load_link_split("lp", tmp_path)
    g = load("lp", tmp_path)
    assert split.metric == metric and split.negatives["test"].shape == shape
    assert g.num_features == 128 and g.num_edges == 2 * len(split.edges["train"])
    split.check_no_leak(g.indptr, g.indices)
    code, _, err = run_cli(["data", "synth", "--preset", "tiny", "--scale", "1.5", "--name",
                            "t", "--root", str(tmp_path)], capsys)  # fmt: skip
    assert_one_line(code, err, "--scale must be in (0, 1]")
