"""Reader of the MUSAE datasets (Rozemberczki et al.): Facebook page-page and GitHub developers.

Files in ``<root>/<facebook|github>/raw/``, or in the directories the datasets are distributed
under (``facebook_page_page/``, PyG's and the MUSAE source's name; ``github_musae/``), which
are also accepted as dataset names (``facebook-page-page``, ``github-musae``): ``edges.csv``
(header ``id_1,id_2``, each undirected edge once; a header alone: a graph without edges),
``target.csv`` (``id`` plus the label column: ``page_type`` strings for Facebook,
``ml_target`` 0/1 for GitHub) and, for Facebook, ``features.json``
(``{node id: [feature ids]}``, turned into a binary bag of words). The GitHub copy here has no
features: ``x`` is ``None`` and ``meta["missing"] == ["features"]``. Neither ships a split; a
seeded per-class split of 20 training and 30 validation nodes per class is used.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from fullgraph.datasets.edges import edges_to_csr
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.paths import DIRECTORIES, dataset_dir, raw_dir
from fullgraph.datasets.split import per_class_split
from fullgraph.errors import DataError

log = logging.getLogger(__name__)

_LABEL_COLUMN = {"facebook": "page_type", "github": "ml_target"}


def musae_dataset(name: str) -> str | None:
    """``facebook`` or ``github`` for any name of theirs (``facebook-page-page``,
    ``github_musae``...), else ``None``."""
    directory = name.replace("-", "_")
    return next((d for d, dirs in DIRECTORIES.items() if directory in dirs), None)


def musae_raw_dir(root: Path, name: str) -> Path:
    """The ``raw/`` of dataset ``name``: its own directory if present, else the first other
    directory of the same dataset that is (``facebook`` finds ``facebook_page_page/``).

    Raises:
        DataError: none of the directories exists (all named), or :func:`raw_dir`'s errors.
    """
    own = dataset_dir(root, name)
    others = [Path(root) / d for d in DIRECTORIES[musae_dataset(name) or name] if d != own.name]
    for d in [own, *others]:
        if os.path.lexists(d):
            return raw_dir(root, d.name)
    if not Path(root).is_dir():
        return raw_dir(root, name)  # its message names the root
    tried = " or ".join(str(d) for d in [own, *others])
    raise DataError(f"dataset {name!r} not found: expected directory {tried}")


def _read_table(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(f"missing file: expected {path}")
    import pyarrow as pa  # imported here, as in the OGB reader
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    except (ValueError, pa.ArrowException) as exc:  # pa.ArrowInvalid: empty, ragged, not text
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{path}: cannot parse as CSV with a header row: {msg}") from exc
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def _ids(table: dict[str, np.ndarray], column: str, path: Path) -> np.ndarray:
    """Column ``column`` of a CSV table as int64 node ids (whole numbers, no gaps)."""
    a = table[column]
    if a.size == 0:  # a header and no rows (an edgeless graph's edges.csv): no type to check
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(a.dtype, np.integer):
        found = "text or empty fields" if a.dtype == object else a.dtype
        raise DataError(f"{path}: column {column!r} must hold integer node ids, found {found}")
    return a.astype(np.int64, copy=False)


def _features(path: Path, n: int) -> np.ndarray:
    try:
        rows = json.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (not UTF-8 text)") from exc
    shape = "a JSON object of node id -> list of feature ids"
    if not isinstance(rows, dict):
        raise DataError(f"{path}: expected {shape}, found {type(rows).__name__}")
    try:
        ids = np.array([int(k) for k in rows], dtype=np.int64)
        lists = [np.asarray(v, dtype=np.int64).reshape(-1) for v in rows.values()]
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(f"{path}: expected {shape} ({exc})") from exc
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise DataError(f"{path}: node id {bad} out of range [0, {n})")
    if any(v.size and v.min() < 0 for v in lists):
        raise DataError(f"{path}: a feature id is negative")
    width = 1 + max((int(v.max()) for v in lists if v.size), default=-1)
    x = np.zeros((n, width), dtype=np.float32)
    for node, feats in zip(ids, lists, strict=True):
        x[node, feats] = 1.0
    return x


def read_musae(
    root: Path,
    name: str,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    seed: int = 0,
) -> Graph:
    """Load ``facebook`` or ``github`` from MUSAE CSV/JSON files.

    Args:
        root: dataset root; files in ``<root>/<name>/raw/`` (or the distributed directory
            name's, :data:`DIRECTORIES`).
        name: ``facebook`` or ``github``, or a name of :data:`DIRECTORIES`
            (``facebook_page_page``, ``github-musae``); the graph is named ``facebook`` /
            ``github`` either way.
        symmetric: add reverse edges.
        remove_self_loops: drop ``v -> v`` edges (Facebook has 179).
        seed: seed of the per-class 20/30 split.

    Returns:
        The graph.

    Raises:
        DataError: missing file (path named) or inconsistent contents.
    """
    raw = musae_raw_dir(root, name)
    name = musae_dataset(name) or name
    target_path = raw / "target.csv"
    target = _read_table(target_path)
    col = _LABEL_COLUMN[name]
    if "id" not in target or col not in target:
        raise DataError(f"{target_path}: needs columns 'id' and {col!r}")
    ids = _ids(target, "id", target_path)
    n = ids.shape[0]
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise DataError(f"{target_path}: ids are not 0..{n - 1} (each once)")
    labels = target[col]
    blank = labels.dtype == object and any(v is None or not str(v).strip() for v in labels)
    if labels.dtype.kind == "f" or blank:
        raise DataError(f"{target_path}: column {col!r} has an empty value; every node needs one")
    classes, codes = np.unique(labels, return_inverse=True)
    y = np.empty(n, dtype=np.int64)
    y[ids] = codes
    edges_path = raw / "edges.csv"
    edges = _read_table(edges_path)
    if "id_1" not in edges or "id_2" not in edges:
        raise DataError(f"{edges_path}: needs columns 'id_1' and 'id_2'")
    indptr, indices = edges_to_csr(
        _ids(edges, "id_1", edges_path),
        _ids(edges, "id_2", edges_path),
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(edges_path),
    )
    missing: list[str] = []
    feat = raw / "features.json"
    if feat.is_file():
        x = _features(feat, n)
    else:
        x = None
        missing.append("features")
        log.warning("%s: %s is missing, so node features are not available", name, feat)
    train, val, test = per_class_split(y, len(classes), 20, 30, seed)
    graph = Graph(
        name=name,
        num_nodes=n,
        indptr=indptr,
        indices=indices,
        x=x,
        y=y,
        train_mask=train,
        val_mask=val,
        test_mask=test,
        num_classes=len(classes),
        meta={
            "format": "musae",
            "path": str(raw),
            "classes": [str(c) for c in classes],
            "split_seed": seed,
            "missing": missing,
        },
    )
    return graph.validate()
