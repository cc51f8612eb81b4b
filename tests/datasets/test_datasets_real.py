"""Every real dataset in ../shared/datasets loads with its published sizes.

The shared copies are read-only: each test links their ``raw/`` directories into a tmp root
laid out as ``<root>/<name with - as _>/raw`` and loads from there.

Enters through :mod:`fullgraph.datasets.registry`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from fullgraph.datasets import load, require_features
from fullgraph.datasets.graph import Graph
from fullgraph.errors import DataError

#: name -> (nodes, directed edges, features (None = absent), classes, (train, val, test))
#: Published sizes (PyG / SOURCE.txt); per-class splits are 20/30 per class, rest test.
EXPECTED = {
    "cora": (2708, 10556, 1433, 7, (140, 500, 1000)),
    "citeseer": (3327, 9104, 3703, 6, (120, 500, 1000)),
    "pubmed": (19717, 88648, None, 3, (60, 500, 1000)),
    "amazon-computers": (13752, 491722, 767, 10, (200, 300, 13752 - 500)),
    "amazon-photo": (7650, 238162, 745, 8, (160, 240, 7650 - 400)),
    "coauthor-cs": (18333, 163788, 6805, 15, (300, 450, 18333 - 750)),
    "coauthor-physics": (34493, 495924, 8415, 5, (100, 150, 34493 - 250)),
    "tolokers": (11758, 1038000, 10, 2, (5879, 2939, 2940)),
    "facebook": (22470, 341646, 4714, 4, (80, 120, 22470 - 200)),
    "github": (37700, 578006, None, 2, (40, 60, 37700 - 100)),
}


@pytest.fixture(scope="module")
def root(shared_root: Path) -> Path:
    """The shared datasets' root (the test skips in a clone without them)."""
    return shared_root


def assert_clean_symmetric(g: Graph) -> None:
    """Symmetric CSR, rows strictly increasing (no duplicates), no self-loops."""
    n = g.num_nodes
    rows = np.repeat(np.arange(n), g.in_degree())
    assert not np.any(rows == g.indices), "self-loop present"
    keys = rows * n + g.indices
    assert np.all(np.diff(keys) > 0), "duplicate or unsorted edges"
    rev = np.sort(g.indices * n + rows)
    assert np.array_equal(keys, rev), "graph is not symmetric"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_published_sizes(root: Path, name: str) -> None:
    if not (root / name.replace("-", "_")).exists():
        pytest.skip(f"shared dataset {name} absent")
    nodes, edges, feats, classes, split = EXPECTED[name]
    g = load(name, root)
    assert (g.num_nodes, g.num_edges, g.num_classes) == (nodes, edges, classes)
    if feats is None:
        assert g.x is None and g.meta["missing"] == ["features"]
        with pytest.raises(DataError, match="no node features"):
            require_features(g)
    else:
        assert g.x.shape == (nodes, feats) and g.x.dtype == np.float32
        require_features(g)
    got = (int(g.train_mask.sum()), int(g.val_mask.sum()), int(g.test_mask.sum()))
    assert got == split
    assert not np.any(g.train_mask & g.val_mask) and not np.any(g.val_mask & g.test_mask)
    assert g.indptr.dtype == np.int64 and g.indices.dtype == np.int64
    assert_clean_symmetric(g)


def test_citeseer_isolated_test_nodes(root: Path) -> None:
    g = load("citeseer", root)
    unlabelled = np.flatnonzero(g.y < 0)
    assert unlabelled.size == 15
    assert np.all(g.x[unlabelled] == 0)
    assert not np.any((g.train_mask | g.val_mask | g.test_mask)[unlabelled])


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_planetoid_matches_pyg(root: Path, tmp_path: Path, name: str) -> None:
    """Our Planetoid reader agrees with torch_geometric's on edges, features, masks, labels."""
    from torch_geometric.datasets import Planetoid

    pyg_name = {"cora": "Cora", "citeseer": "CiteSeer"}[name]
    shutil.copytree(root / name / "raw", tmp_path / pyg_name / "raw")
    data = Planetoid(str(tmp_path), pyg_name)[0]
    g = load(name, root)
    ei = data.edge_index.numpy()
    pyg_keys = np.sort(ei[1] * g.num_nodes + ei[0])
    ours = np.repeat(np.arange(g.num_nodes), g.in_degree()) * g.num_nodes + g.indices
    assert np.array_equal(pyg_keys, ours)
    assert np.array_equal(data.x.numpy(), g.x)
    for m in ("train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(data, m).numpy(), getattr(g, m))
    labelled = g.y >= 0
    assert np.array_equal(data.y.numpy()[labelled], g.y[labelled])


def test_per_class_split_is_seeded(root: Path) -> None:
    a = load("amazon-photo", root, seed=0)
    b = load("amazon-photo", root, seed=0)
    c = load("amazon-photo", root, seed=1)
    assert np.array_equal(a.train_mask, b.train_mask)
    assert not np.array_equal(a.train_mask, c.train_mask)
    assert np.all(np.bincount(a.y[a.train_mask], minlength=a.num_classes) == 20)
    assert np.all(np.bincount(a.y[a.val_mask], minlength=a.num_classes) == 30)


def test_directed_option_keeps_raw_edges(root: Path) -> None:
    g = load("tolokers", root, symmetric=False)
    assert g.num_edges == 519000  # each undirected edge stored once in the file


def test_missing_planetoid_file_names_path(root: Path, tmp_path: Path) -> None:
    raw = tmp_path / "cora" / "raw"
    shutil.copytree(root / "cora" / "raw", raw)
    (raw / "ind.cora.graph").unlink()
    with pytest.raises(DataError, match=r"missing file: expected .*ind\.cora\.graph"):
        load("cora", tmp_path)


def test_missing_npz_names_path(tmp_path: Path) -> None:
    (tmp_path / "amazon_computers" / "raw").mkdir(parents=True)
    with pytest.raises(DataError, match=r"expected .*amazon_electronics_computers\.npz"):
        load("amazon-computers", tmp_path)
