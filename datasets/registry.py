"""``load(name, root)``: one entry point that finds the right reader for a dataset name.

Every dataset lives in ``<root>/<name with - as _>/`` with its files in ``raw/``:

============================  =============================================================
name                          files in ``raw/``
============================  =============================================================
cora, citeseer, pubmed        Planetoid ``ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}``
amazon-computers/-photo,      gnn-benchmark ``.npz`` (or a ``.zip`` holding it); seeded split
coauthor-cs/-physics          of 20 train / 30 validation nodes per class, rest test
tolokers                      heterophilous-graphs ``tolokers.npz``; fixed split ``split``
                              (0-9, default 0)
facebook, github              MUSAE ``edges.csv``, ``target.csv`` (+ ``features.json``); the
                              directories (and names) they are distributed under,
                              ``facebook_page_page``, ``github_musae``, are accepted too
ogbn-<anything>               OGB node-property layout (``edge.csv.gz`` ...)
ogbl-<anything>               OGB link-property layout: the message-passing graph
                              (:mod:`fullgraph.datasets.ogb_link`; ``load_link_split``)
any other name                OGB layout with fullgraph's ``meta.json`` marker (``data synth``)
============================  =============================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.paths import dataset_dir
from fullgraph.errors import ConfigError, DataError

log = logging.getLogger(__name__)

#: Names with fixed splits to choose from (``load(..., split=K)``), and how many.
FIXED_SPLITS = {"tolokers": 10}

#: Names with a dedicated reader (``ogbn-*`` and synthetic names are matched separately).
KNOWN_NAMES = (
    "cora",
    "citeseer",
    "pubmed",
    "amazon-computers",
    "amazon-photo",
    "coauthor-cs",
    "coauthor-physics",
    "tolokers",
    "facebook",
    "github",
)


def _reader(name: str) -> Callable[..., Graph] | None:
    if name in ("cora", "citeseer", "pubmed"):
        from fullgraph.datasets.planetoid import read_planetoid

        return read_planetoid
    if name in ("amazon-computers", "amazon-photo", "coauthor-cs", "coauthor-physics"):
        from fullgraph.datasets.gnn_benchmark import read_gnn_benchmark

        return read_gnn_benchmark
    if name == "tolokers":
        from fullgraph.datasets.heterophilous import read_heterophilous

        return read_heterophilous
    from fullgraph.datasets.musae import musae_dataset, read_musae

    if musae_dataset(name) is not None:
        return read_musae
    return None


def load(
    name: str,
    root: str | Path,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    seed: int = 0,
    cache: bool = True,
    mmap: bool = False,
    split: int | None = None,
) -> Graph:
    """Load dataset ``name`` from ``<root>/<name with - as _>/``; nothing is downloaded.

    Args:
        name: one of :data:`KNOWN_NAMES`, ``ogbn-<name>``, or a name written by
            ``fullgraph data synth`` / :func:`fullgraph.datasets.synthetic.write_ogb`.
        root: the dataset root directory.
        symmetric: add the reverse of every edge (default: the graph is undirected).
        remove_self_loops: drop ``v -> v`` edges (duplicates are always merged).
        seed: seed of the per-class split of datasets without a fixed one (Amazon, Coauthor).
        cache: OGB layout only: read/write the ``processed/`` ``.npy`` cache.
        mmap: OGB layout only: memory-map the cached arrays.
        split: which fixed split of a dataset that ships several (:data:`FIXED_SPLITS`;
            default its first); refused for any other dataset.

    Returns:
        The validated :class:`Graph`. ``graph.meta["missing"]`` lists parts the source lacks
        (``["features"]`` for PubMed, whose ``x`` is ``None``).

    Raises:
        DataError: a name that is a path (``../x``), a root that is not a directory, unknown
            name (the known ones listed), missing file (the path named), malformed data.
        ConfigError: ``split`` for a dataset without fixed splits, or out of range.
    """
    root = Path(root)
    d = dataset_dir(root, name)  # refuses a name that is a path before anything is read
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DataError(f"dataset root {root} {what}; give the directory that holds {d.name}/")
    extra = {}
    if split is not None:
        count = FIXED_SPLITS.get(name)
        if count is None:
            fixed = ", ".join(FIXED_SPLITS)
            raise ConfigError(
                f"--split: {name} has no fixed splits to choose from (those of {fixed} do)"
            )
        if not 0 <= split < count:
            raise ConfigError(
                f"--split: {name} has {count} fixed splits (0-{count - 1}), not {split}"
            )
        extra["split"] = split
    reader = _reader(name)
    if reader is not None:
        return reader(
            root,
            name,
            symmetric=symmetric,
            remove_self_loops=remove_self_loops,
            seed=seed,
            **extra,
        )
    from fullgraph.datasets.ogb_link import is_link_dataset, read_ogb_link

    if is_link_dataset(root, name):
        return read_ogb_link(
            root,
            name,
            symmetric=symmetric,
            remove_self_loops=remove_self_loops,
            cache=cache,
            mmap=mmap,
        )
    if name.startswith("ogbn-") or (d / "meta.json").is_file():
        from fullgraph.datasets.ogb import read_ogb

        return read_ogb(
            root,
            name,
            symmetric=symmetric,
            remove_self_loops=remove_self_loops,
            cache=cache,
            mmap=mmap,
        )
    hint = f" ({d} is not a fullgraph dataset directory)" if d.is_dir() else ""
    raise DataError(
        f"unknown dataset {name!r}{hint}; known: {', '.join(KNOWN_NAMES)}, ogbn-<name>, "
        f"ogbl-<name>, or a name written by `fullgraph data synth`"
    )


def require_features(graph: Graph) -> None:
    """Raise :class:`DataError` if ``graph`` has no node features (e.g. PubMed here).

    Args:
        graph: a loaded graph.
    """
    if graph.x is None:
        missing = graph.meta.get("missing", [])
        detail = f" (source lacks: {', '.join(missing)})" if missing else ""
        raise DataError(f"{graph.name}: no node features available{detail}")
