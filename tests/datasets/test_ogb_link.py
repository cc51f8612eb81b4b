"""OGB linkprop reader on tiny hand-written directories (csv.gz + torch.save'd split dicts):
the message-passing graph, the checked split, and one line for each malformed file."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fullgraph.datasets import load, load_link_split
from fullgraph.errors import DataError

N = 8
# training edges of a collab-like graph: (0, 1) listed twice (two years), once reversed
TRAIN = [(0, 1), (1, 2), (2, 3), (1, 0), (4, 5), (5, 6)]
WEIGHTS = [1.0, 2.0, 1.0, 3.0, 1.0, 2.0]
VALID, VALID_NEG = [(3, 4), (0, 7)], [(0, 5), (2, 6), (1, 7)]
TEST, TEST_NEG = [(6, 7)], [(0, 3), (4, 7)]


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def _t(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def write_collab(root: Path, name: str = "ogbl-collab", features: bool = True) -> Path:
    """A tiny ogbl-collab laid out as OGB ships it (training edges in raw/, weights, years)."""
    d = root / name.replace("-", "_")
    raw = d / "raw"
    _gz(raw / "edge.csv.gz", [f"{u},{v}" for u, v in TRAIN])
    _gz(raw / "edge_weight.csv.gz", [f"{w:g}" for w in WEIGHTS])
    _gz(raw / "edge_year.csv.gz", ["2010"] * len(TRAIN))
    _gz(raw / "num-node-list.csv.gz", [str(N)])
    _gz(raw / "num-edge-list.csv.gz", [str(len(TRAIN))])
    if features:
        _gz(raw / "node-feat.csv.gz", [f"{v},{v / 2:g}" for v in range(N)])
    split = d / "split" / "time"
    split.mkdir(parents=True)
    year = torch.full((len(TRAIN),), 2010)
    weight = torch.tensor(WEIGHTS)
    torch.save({"edge": _t(TRAIN), "weight": weight, "year": year}, split / "train.pt")
    for s, pos, neg in (("valid", VALID, VALID_NEG), ("test", TEST, TEST_NEG)):
        ones = torch.ones(len(pos))
        torch.save({"edge": _t(pos), "edge_neg": _t(neg), "weight": ones}, split / f"{s}.pt")
    return split


def write_citation(root: Path) -> Path:
    """A tiny ogbl-citation2: directed citations, per-edge negative targets (K = 3)."""
    d = root / "ogbl_citation2"
    raw = d / "raw"
    edges = [(1, 0), (2, 0), (2, 1), (3, 2), (4, 3)]
    _gz(raw / "edge.csv.gz", [f"{u},{v}" for u, v in edges])
    _gz(raw / "num-node-list.csv.gz", ["7"])
    _gz(raw / "num-edge-list.csv.gz", [str(len(edges))])
    _gz(raw / "node-feat.csv.gz", [f"{v}" for v in range(7)])
    _gz(raw / "node_year.csv.gz", ["2000"] * 7)
    split = d / "split" / "time"
    split.mkdir(parents=True)
    src, dst = _t([u for u, _ in edges]), _t([v for _, v in edges])
    torch.save({"source_node": src, "target_node": dst}, split / "train.pt")
    for s, (u, v) in (("valid", (5, 1)), ("test", (6, 4))):
        part = {"source_node": _t([u]), "target_node": _t([v]), "target_node_neg": _t([[0, 2, 3]])}
        torch.save(part, split / f"{s}.pt")
    return split


def edge_set(g) -> set[tuple[int, int]]:
    dst = np.repeat(np.arange(g.num_nodes), g.in_degree())
    return set(zip(g.indices.tolist(), dst.tolist(), strict=True))


def test_collab_graph_is_the_training_edges_both_ways_repeats_merged(tmp_path: Path) -> None:
    write_collab(tmp_path)
    g = load("ogbl-collab", tmp_path)
    undirected = {(0, 1), (1, 2), (2, 3), (4, 5), (5, 6)}
    assert edge_set(g) == undirected | {(v, u) for u, v in undirected}
    assert g.num_classes == 1 and (g.y == 0).all()
    assert not (g.train_mask.any() or g.val_mask.any() or g.test_mask.any())
    np.testing.assert_array_equal(g.x[:, 0], np.arange(N))
    # (0, 1) twice, once reversed: one edge of weight 1 + 3 in both directions
    dst = np.repeat(np.arange(N), g.in_degree()).tolist()
    pairs = zip(g.indices.tolist(), dst, strict=True)
    weight = dict(zip(pairs, g.edge_weight.tolist(), strict=True))
    assert weight[0, 1] == weight[1, 0] == 4.0 and weight[1, 2] == 2.0
    again = load("ogbl-collab", tmp_path)  # from the processed/ cache
    np.testing.assert_array_equal(again.indices, g.indices)


def test_collab_split_is_checked_with_ogb_metric(tmp_path: Path) -> None:
    write_collab(tmp_path)
    split = load_link_split("ogbl-collab", tmp_path)
    assert split is not None and split.metric == "hits@50" and split.undirected
    assert not split.per_edge_negatives and split.num_nodes == N
    train = sorted(map(tuple, split.edges["train"].tolist()))
    assert train == [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6)]
    assert split.edge_weight["train"][0] == 4.0  # the repeated pair's weights summed
    np.testing.assert_array_equal(split.edges["valid"], VALID)
    np.testing.assert_array_equal(split.negatives["test"], TEST_NEG)
    g = load("ogbl-collab", tmp_path)
    split.check_no_leak(g.indptr, g.indices)  # the held-out edges are not in the graph


def test_citation2_per_edge_negatives_directed_split_graph_symmetrised(tmp_path: Path) -> None:
    write_citation(tmp_path)
    g = load("ogbl-citation2", tmp_path)
    assert (0, 1) in edge_set(g) and (1, 0) in edge_set(g)  # used both ways
    split = load_link_split("ogbl-citation2", tmp_path)
    assert split.per_edge_negatives and not split.undirected and split.metric == "mrr"
    assert split.negatives["valid"].shape == (1, 3) and split.num_negatives_per_edge == 3
    np.testing.assert_array_equal(split.negative_pairs("test"), [[6, 0], [6, 2], [6, 3]])


def test_no_features_and_no_link_split(tmp_path: Path) -> None:
    write_collab(tmp_path, "ogbl-ddi", features=False)
    g = load("ogbl-ddi", tmp_path, cache=False)
    assert g.x is None and g.meta["missing"] == ["features"]
    assert load_link_split("ogbl-ddi", tmp_path).metric == "hits@20"
    assert load_link_split("cora", tmp_path) is None  # no link dataset of that name


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _save(obj: object) -> Callable[[Path], None]:
    return lambda path: torch.save(obj, path)


BAD = {
    "truncated csv": ("raw", "edge.csv.gz", _truncate, "truncated or corrupted"),
    "wrong keys": ("split", "valid.pt", _save({"edges": _t(VALID)}), "expected OGB's 'edge'"),
    "missing key": ("split", "test.pt", _save({"edge": _t(TEST)}), "lacks ['edge_neg']"),
    "unknown key": (
        "split",
        "train.pt",
        _save({"edge": _t(TRAIN), "relation": _t([0] * 6)}),
        "unknown keys ['relation']",
    ),
    "ids out of range": (
        "split",
        "valid.pt",
        _save({"edge": _t([(3, 4), (0, 99)]), "edge_neg": _t(VALID_NEG)}),
        "out of range for 8 nodes",
    ),
    "not a dict": ("split", "train.pt", _save(_t(TRAIN)), "holds a Tensor, expected a dict"),
    "list values": ("split", "train.pt", _save({"edge": [[0, 1]]}), "holds a list, expected a"),
    "garbage": ("split", "test.pt", lambda p: p.write_bytes(b"not torch"), "not a readable torch"),
    "float ids": (
        "split",
        "test.pt",
        _save({"edge": torch.tensor([[6.0, 7.0]]), "edge_neg": _t(TEST_NEG)}),
        "node ids are integers",
    ),
    "bad shape": (
        "split",
        "test.pt",
        _save({"edge": _t([6, 7]), "edge_neg": _t(TEST_NEG)}),
        "[E, 2]",
    ),
    "held-out pair twice": (
        "split",
        "valid.pt",
        _save({"edge": _t([(3, 4), (4, 3)]), "edge_neg": _t(VALID_NEG)}),
        "appears 2 times",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_files_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    split = write_collab(tmp_path)
    where, fname, damage, expected = BAD[case]
    path = (split if where == "split" else split.parent.parent / "raw") / fname
    damage(path)
    with pytest.raises(DataError) as info:
        if where == "raw":
            load("ogbl-collab", tmp_path)
        else:
            load_link_split("ogbl-collab", tmp_path)
    message = str(info.value)
    assert "\n" not in message and expected in message, message
    assert str(split if where == "split" else path) in message


def test_mixed_layouts_refused(tmp_path: Path) -> None:
    split = write_collab(tmp_path)
    per_edge = {"source_node": _t([6]), "target_node": _t([7]), "target_node_neg": _t([[0]])}
    torch.save(per_edge, split / "test.pt")
    with pytest.raises(DataError, match="must have the same keys"):
        load_link_split("ogbl-collab", tmp_path)
