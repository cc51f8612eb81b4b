"""The ``papers`` preset (ogbn-papers100M's sizes, few and clustered labels) and the
configuration fields it brought, which leave every older preset's graph as it was.

Enters through :mod:`fullgraph.datasets.synthetic`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.synthetic import PRESETS, generate, resolve
from fullgraph.errors import ConfigError

ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")
SCALE = 1 / 2000

#: sha256 over the arrays (name, dtype, bytes) of ``generate(preset, seed=0)`` as written
#: before the papers preset came (commit 1e5a097): its new fields must not change them
#: (checked in ``test_synthetic.py`` on its module's graphs, generated once there).
DIGESTS = {
    "tiny": "492a18b501ef8e7e9b6f930f68c510c6b8c4ddfde5060f75435096d0120433bf",
    "arxiv": "98cb3372a3a88e9831f9aea75910dfc68acaf0ff9f7560cb78f2fb2c004f2ed8",
}


def digest(graph: Graph) -> str:
    h = hashlib.sha256()
    for a in ARRAYS:
        v = np.ascontiguousarray(getattr(graph, a))
        h.update(a.encode())
        h.update(str(v.dtype).encode())
        h.update(v.tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def papers() -> Graph:
    return generate("papers", seed=0, scale=SCALE)


def test_papers_sizes_and_fractions(papers: Graph) -> None:
    full = PRESETS["papers"]
    n = round(full.num_nodes * SCALE)
    assert papers.num_nodes == n and papers.num_edges == 2 * round(full.num_edges * SCALE)
    assert papers.x.shape == (n, 128) and papers.num_classes == 172
    assert int(papers.train_mask.sum()) == round(full.train_frac * n)
    assert int(papers.val_mask.sum()) == round(full.val_frac * n)
    # the three rounded counts may pass the rounded labelled count by one: test takes the rest
    assert abs(int(papers.test_mask.sum()) - round(full.test_frac * n)) <= 1
    in_split = papers.train_mask | papers.val_mask | papers.test_mask
    labelled = papers.y >= 0
    assert np.array_equal(in_split, labelled)  # y = -1 exactly outside the three splits
    assert int(labelled.sum()) == round(full.labelled_frac * n)
    deg = np.diff(papers.indptr)
    assert deg.min() >= 1 and deg.max() >= 20 * deg.mean()  # heavy tail, none isolated


def test_papers_labels_cluster(papers: Graph) -> None:
    """A labelled node's neighbours are labelled far more often than a random node is."""
    labelled = papers.y >= 0
    rows = np.repeat(np.arange(papers.num_nodes), np.diff(papers.indptr))
    share = labelled[papers.indices[labelled[rows]]].mean()
    assert share > 10 * labelled.mean()
    spread = generate("papers", seed=0, scale=SCALE, labelled_topics=1.0)
    labelled = spread.y >= 0
    rows = np.repeat(np.arange(spread.num_nodes), np.diff(spread.indptr))
    assert labelled[spread.indices[labelled[rows]]].mean() < 3 * labelled.mean()  # control


def test_test_frac_and_unlabelled_on_other_presets() -> None:
    g = generate("tiny", seed=0, test_frac=0.1, labelled_frac=0.7)
    n = g.num_nodes
    assert int(g.test_mask.sum()) == round(0.1 * n) and int((g.y >= 0).sum()) == round(0.7 * n)
    assert not np.any(g.y[g.train_mask | g.val_mask | g.test_mask] < 0)


@pytest.mark.parametrize(
    ("overrides", "scale", "needle"),
    [
        ({}, 0.0, "--scale must be in (0, 1]"),
        ({}, 2.0, "--scale must be in (0, 1]"),
        ({"labelled_frac": 0.001}, SCALE, "exceeds labelled_frac"),
        ({"labelled_topics": 0.0}, SCALE, "labelled_topics"),
        ({"surplus": "local"}, SCALE, "unknown surplus"),
    ],
)
def test_bad_config_is_one_line(overrides: dict, scale: float, needle: str) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]*$") as info:
        resolve("papers", overrides, scale)
    assert needle in str(info.value)
