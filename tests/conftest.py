"""Shared fixtures: small synthetic graphs and their partitions, built once per session.

Fixtures other test modules can use:

- ``make_graph(num_nodes=..., ...)``: a factory returning a small symmetric, labelled
  :class:`~fullgraph.datasets.graph.Graph` (stochastic block model, deterministic from ``seed``);
  see :func:`build_sbm_graph` for its parameters.
- ``small_graph``: ``make_graph()`` with the defaults (600 nodes, 4 blocks, 12 features,
  4 classes, ~30% training nodes, a few isolated nodes), shared by the whole session.
- ``small_partitions``: ``{P: path}`` for P = 1, 2, 4, METIS partitions of ``small_graph``
  written with :func:`fullgraph.partition.partition_graph` into a session tmp dir. Treat them as
  read-only (copy one with ``shutil.copytree`` before tampering with it).
- ``shared_root``: a dataset root whose ``<name>/raw`` entries link to the read-only real
  datasets of ``../shared/datasets`` (or ``$FULLGRAPH_SHARED_DATASETS``); tests using it skip
  where that directory is absent (a fresh clone). ``shared_dataset(name)`` gives the root after
  checking that dataset ``name`` is there (skipping otherwise). The one place that path lives.

Markers: ``slow`` marks the long tests (accuracy targets, multi-process sweeps);
``pytest -m "not slow"`` is the fast set for development, CI runs everything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

# Triton decides when it is imported whether its library functions run in the interpreter, so
# the Triton tests on CPU tensors need the variable before anything (PyG too) imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import scipy.sparse as sp

from fullgraph.datasets.graph import Graph


def build_sbm_graph(
    num_nodes: int = 600,
    num_blocks: int = 4,
    avg_degree: float = 8.0,
    p_in: float = 0.85,
    num_features: int = 12,
    num_classes: int = 4,
    train_fraction: float = 0.3,
    num_isolated: int = 3,
    directed: bool = False,
    seed: int = 0,
    name: str = "sbm-test",
) -> Graph:
    """A stochastic-block-model graph with labels equal to blocks (mod ``num_classes``).

    Args:
        num_nodes: number of nodes N.
        num_blocks: number of blocks (communities).
        avg_degree: mean number of sampled edges per node before symmetrising.
        p_in: probability that a sampled edge stays inside its block.
        num_features: feature width F (0 gives ``x = None``).
        num_classes: number of classes; ``y = block % num_classes``.
        train_fraction: share of nodes in the training mask; 20% of the rest validate, the
            remainder test (a few nodes are left unlabelled with ``y = -1`` and in no mask).
        num_isolated: the last ``num_isolated`` nodes get no edges.
        directed: keep the sampled directions (otherwise the graph is symmetrised).
        seed: random seed.
        name: graph name.

    Returns:
        A validated :class:`Graph` (CSR of incoming edges, no self-loops or duplicates).
    """
    rng = np.random.default_rng(seed)
    block = rng.integers(0, num_blocks, num_nodes)
    linked = num_nodes - num_isolated
    m = int(avg_degree * linked)
    src = rng.integers(0, linked, m)
    dst = rng.integers(0, linked, m)
    same = rng.random(m) < p_in
    members = [np.flatnonzero(block[:linked] == b) for b in range(num_blocks)]
    for b in range(num_blocks):
        pick = same & (block[src] == b)
        if members[b].size:
            dst[pick] = rng.choice(members[b], int(pick.sum()))
    a = sp.csr_matrix((np.ones(m, dtype=np.bool_), (dst, src)), shape=(num_nodes, num_nodes))
    if not directed:
        a = (a + a.T).tocsr()
    a.setdiag(False)
    a.eliminate_zeros()
    a.sort_indices()
    y = (block % num_classes).astype(np.int64)
    unlabelled = rng.random(num_nodes) < 0.02
    y[unlabelled] = -1
    r = rng.random(num_nodes)
    train = (r < train_fraction) & ~unlabelled
    val = (r >= train_fraction) & (r < train_fraction + 0.2 * (1 - train_fraction)) & ~unlabelled
    test = ~train & ~val & ~unlabelled
    x = None
    if num_features:
        centers = rng.normal(size=(num_classes, num_features))
        x = (centers[block % num_classes] + rng.normal(size=(num_nodes, num_features))).astype(
            np.float32
        )
    return Graph(
        name=name,
        num_nodes=num_nodes,
        indptr=a.indptr.astype(np.int64),
        indices=a.indices.astype(np.int64),
        x=x,
        y=y,
        train_mask=train,
        val_mask=val,
        test_mask=test,
        num_classes=num_classes,
    ).validate()


@pytest.fixture(scope="session")
def make_graph() -> Callable[..., Graph]:
    """Factory of small SBM graphs: ``make_graph(**kwargs)`` calls :func:`build_sbm_graph`."""
    return build_sbm_graph


@pytest.fixture(scope="session")
def small_graph() -> Graph:
    """The default 600-node SBM graph, shared by the session (do not modify it)."""
    return build_sbm_graph()


@pytest.fixture(scope="session")
def small_partitions(small_graph: Graph, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """METIS partitions of ``small_graph`` into 1, 2 and 4 parts: ``{P: Path}`` (read-only)."""
    from fullgraph.partition import partition_graph

    root = tmp_path_factory.mktemp("partitions")
    paths: dict[int, Path] = {}
    for p in (1, 2, 4):
        paths[p] = root / f"{small_graph.name}-{p}"
        partition_graph(small_graph, p, paths[p], method="metis", seed=0)
    return paths


#: The real datasets beside the checkout (read-only; never written next to).
SHARED_DATASETS = Path(
    os.environ.get(
        "FULLGRAPH_SHARED_DATASETS",
        Path(__file__).resolve().parents[1].parent / "shared" / "datasets",
    )
)

#: dataset name -> its directory in the shared datasets
SHARED_DIRS = {
    "cora": "cora",
    "citeseer": "citeseer",
    "pubmed": "pubmed",
    "amazon-computers": "amazon_computers",
    "amazon-photo": "amazon_photo",
    "coauthor-cs": "coauthor_cs",
    "coauthor-physics": "coauthor_physics",
    "tolokers": "tolokers",
    "facebook": "facebook_page_page",
    "github": "github_musae",
}


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset root linking ``<name>/raw`` to every shared dataset present (read-only)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    root = tmp_path_factory.mktemp("shared-datasets")
    for name, shared in SHARED_DIRS.items():
        src = SHARED_DATASETS / shared / "raw"
        if src.is_dir():
            d = root / name.replace("-", "_")
            d.mkdir()
            (d / "raw").symlink_to(src, target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def shared_dataset(shared_root: Path) -> Callable[[str], Path]:
    """``shared_dataset(name)``: the root holding dataset ``name``, or skip when it is absent."""

    def root_of(name: str) -> Path:
        if not (shared_root / name.replace("-", "_")).exists():
            pytest.skip(f"{SHARED_DATASETS / SHARED_DIRS[name]} absent")
        return shared_root

    return root_of
