"""Reader of heterophilous-graphs ``.npz`` datasets (Tolokers).

heterophilous-graphs (Platonov et al., 2023): ``raw/<name>.npz`` with ``node_features``,
``node_labels``, ``edges`` [E, 2] (each undirected edge once) and ten fixed splits as
``train_masks``/``val_masks``/``test_masks`` [10, N]; split 0 is used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fullgraph.datasets.edges import edges_to_csr
from fullgraph.datasets.graph import Graph, first_overlap
from fullgraph.datasets.npz_arrays import (
    check_finite,
    integers,
    labels,
    need_arrays,
    numbers,
    open_npz,
)
from fullgraph.datasets.paths import raw_dir
from fullgraph.errors import DataError


def read_heterophilous(
    root: Path,
    name: str,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    seed: int = 0,
    split: int = 0,
) -> Graph:
    """Load a heterophilous-graphs dataset (``tolokers``) with its fixed split ``split``.

    Args:
        root: dataset root; the file is ``<root>/<name>/raw/<name>.npz``.
        name: dataset name (``tolokers``).
        symmetric: add reverse edges (the file stores each undirected edge once).
        remove_self_loops: drop ``v -> v`` edges.
        seed: unused (the splits are fixed); accepted for a uniform reader signature.
        split: which of the ten fixed splits to use.

    Returns:
        The graph.

    Raises:
        DataError: missing file (path named) or inconsistent arrays.
    """
    del seed
    raw = raw_dir(root, name)
    fname = f"{name.replace('-', '_')}.npz"
    arrays, path = open_npz(raw, fname, f"{name}.zip")
    keys = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
    need_arrays(arrays, keys, path)
    n = numbers(arrays, "node_labels", path, 1).shape[0]
    y = labels(arrays, "node_labels", path, n)
    x = numbers(arrays, "node_features", path, 2)
    if x.shape[0] != n:
        raise DataError(f"{path}: node_features has {x.shape[0]} rows but {n} node_labels")
    check_finite(x, "node_features", path)  # as stored: 1e308 is refused before float32
    x = np.asarray(x, dtype=np.float32)
    edges = integers(arrays, "edges", path, ndim=2)
    if edges.shape[1] != 2:
        raise DataError(f"{path}: edges have shape {edges.shape}, expected (E, 2)")
    indptr, indices = edges_to_csr(
        edges[:, 0],
        edges[:, 1],
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=f"{path} (edges)",
    )
    masks = []
    for key in ("train_masks", "val_masks", "test_masks"):
        m = integers(arrays, key, path, ndim=2)
        if m.shape[1] != n or not 0 <= split < m.shape[0]:
            raise DataError(f"{path}: {key} has shape {m.shape}; need split {split} of {n}")
        m = m[split]
        if m.size and (m.min() < 0 or m.max() > 1):
            raise DataError(f"{path}: {key} holds values other than 0 and 1")
        masks.append(np.ascontiguousarray(m.astype(np.bool_)))
    keys = ("train_masks", "val_masks", "test_masks")
    overlap = first_overlap(dict(zip(keys, masks, strict=True)))
    if overlap is not None:
        a, b, v = overlap
        raise DataError(
            f"{path}: node {v} is in both {a} and {b} of split {split}; a node may be in one "
            f"split only"
        )
    graph = Graph(
        name=name,
        num_nodes=n,
        indptr=indptr,
        indices=indices,
        x=x,
        y=y,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=int(y.max()) + 1 if n else 0,
        meta={"format": "heterophilous", "path": str(path), "split": split, "missing": []},
    )
    return graph.validate()
