"""Reader of the MUSAE datasets (Rozemberczki et al.): Facebook page-page and GitHub developers.

Files in ``<root>/<facebook|github>/raw/``: ``edges.csv`` (header ``id_1,id_2``, each
undirected edge once), ``target.csv`` (``id`` plus the label column: ``page_type`` strings for
Facebook, ``ml_target`` 0/1 for GitHub) and, for Facebook, ``features.json``
(``{node id: [feature ids]}``, turned into a binary bag of words). The GitHub copy here has no
features: ``x`` is ``None`` and ``meta["missing"] == ["features"]``. Neither ships a split; a
seeded per-class split of 20 training and 30 validation nodes per class is used.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_writer import dataset_dir
from fullgraph.datasets.ops import edges_to_csr
from fullgraph.datasets.split import per_class_split
from fullgraph.errors import DataError

log = logging.getLogger(__name__)

_LABEL_COLUMN = {"facebook": "page_type", "github": "ml_target"}


def _read_table(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(f"missing file: expected {path}")
    import pyarrow.csv as pacsv  # imported here, as in the OGB reader

    table = pacsv.read_csv(path)
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


def _features(path: Path, n: int) -> np.ndarray:
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg})") from exc
    ids = np.array([int(k) for k in rows], dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise DataError(f"{path}: node id {int(ids.max())} out of range [0, {n})")
    width = 1 + max((max(v) for v in rows.values() if v), default=-1)
    x = np.zeros((n, width), dtype=np.float32)
    for node, feats in zip(ids, rows.values(), strict=True):
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
        root: dataset root; files in ``<root>/<name>/raw/``.
        name: ``facebook`` or ``github``.
        symmetric: add reverse edges.
        remove_self_loops: drop ``v -> v`` edges (Facebook has 179).
        seed: seed of the per-class 20/30 split.

    Returns:
        The graph.

    Raises:
        DataError: missing file (path named) or inconsistent contents.
    """
    raw = dataset_dir(root, name) / "raw"
    target = _read_table(raw / "target.csv")
    col = _LABEL_COLUMN[name]
    if "id" not in target or col not in target:
        raise DataError(f"{raw / 'target.csv'}: needs columns 'id' and {col!r}")
    n = target["id"].shape[0]
    if not np.array_equal(np.sort(target["id"]), np.arange(n)):
        raise DataError(f"{raw / 'target.csv'}: ids are not 0..{n - 1}")
    classes, codes = np.unique(target[col], return_inverse=True)
    y = np.empty(n, dtype=np.int64)
    y[target["id"].astype(np.int64)] = codes
    edges = _read_table(raw / "edges.csv")
    if "id_1" not in edges or "id_2" not in edges:
        raise DataError(f"{raw / 'edges.csv'}: needs columns 'id_1' and 'id_2'")
    indptr, indices = edges_to_csr(
        edges["id_1"],
        edges["id_2"],
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(raw / "edges.csv"),
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
