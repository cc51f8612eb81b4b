"""Readers of ``.npz`` datasets: gnn-benchmark (Amazon, Coauthor) and heterophilous (Tolokers).

gnn-benchmark (Shchur et al., 2018): ``raw/<file>.npz`` or a ``raw/<name>.zip`` holding it,
with the adjacency and the features as CSR pieces (``adj_data``, ``adj_indices``,
``adj_indptr``, ``adj_shape``, ``attr_*``) and ``labels``. There is no fixed split; the split
is seeded and per class: 20 training and 30 validation nodes of every class, the rest test.

heterophilous-graphs (Platonov et al., 2023): ``raw/<name>.npz`` with ``node_features``,
``node_labels``, ``edges`` [E, 2] (each undirected edge once) and ten fixed splits as
``train_masks``/``val_masks``/``test_masks`` [10, N]; split 0 is used.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_writer import dataset_dir
from fullgraph.datasets.ops import edges_to_csr
from fullgraph.datasets.split import per_class_split
from fullgraph.errors import DataError

#: Dataset name -> file name of the npz inside ``raw/`` (or inside ``raw/<name>.zip``).
GNN_BENCHMARK_FILES = {
    "amazon-computers": "amazon_electronics_computers.npz",
    "amazon-photo": "amazon_electronics_photo.npz",
    "coauthor-cs": "ms_academic_cs.npz",
    "coauthor-physics": "ms_academic_phy.npz",
}


def _numeric(f: np.lib.npyio.NpzFile) -> dict:
    """The arrays of ``f`` that load without pickle (names/strings stored as objects skipped)."""
    out = {}
    for k in f.files:
        try:
            out[k] = f[k]
        except ValueError:
            continue
    return out


def _open_npz(raw: Path, npz_name: str, zip_name: str) -> tuple[dict, Path]:
    """Numeric arrays of ``raw/npz_name``, or of the npz inside ``raw/zip_name``."""
    npz_path, zip_path = raw / npz_name, raw / zip_name
    try:
        if npz_path.is_file():
            with np.load(npz_path, allow_pickle=False) as f:
                return _numeric(f), npz_path
        if zip_path.is_file():
            with zipfile.ZipFile(zip_path) as z:
                members = [m for m in z.namelist() if m.endswith(".npz")]
                if not members:
                    raise DataError(f"{zip_path}: holds no .npz file")
                member = npz_name if npz_name in members else members[0]
                with np.load(io.BytesIO(z.read(member)), allow_pickle=False) as f:
                    return _numeric(f), zip_path
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DataError(f"{raw}: cannot read {npz_name} ({exc})") from exc
    raise DataError(f"missing file: expected {npz_path} (or {zip_path})")


def _need(arrays: dict, keys: tuple[str, ...], path: Path) -> None:
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing arrays {missing}")


def read_gnn_benchmark(
    root: Path,
    name: str,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    seed: int = 0,
) -> Graph:
    """Load Amazon Computers/Photo or Coauthor CS/Physics from gnn-benchmark ``.npz``.

    Args:
        root: dataset root; files in ``<root>/<name with - as _>/raw/``.
        name: one of :data:`GNN_BENCHMARK_FILES`.
        symmetric: add reverse edges.
        remove_self_loops: drop ``v -> v`` edges.
        seed: seed of the per-class 20/30 split.

    Returns:
        The graph with dense float32 features.

    Raises:
        DataError: missing file (path named) or inconsistent arrays.
    """
    raw = dataset_dir(root, name) / "raw"
    arrays, path = _open_npz(raw, GNN_BENCHMARK_FILES[name], f"{name}.zip")
    _need(arrays, ("adj_data", "adj_indices", "adj_indptr", "adj_shape", "labels"), path)
    n = int(arrays["adj_shape"][0])
    adj = sp.csr_matrix(
        (arrays["adj_data"], arrays["adj_indices"], arrays["adj_indptr"]),
        shape=tuple(arrays["adj_shape"]),
    ).tocoo()
    x = None
    if "attr_data" in arrays:
        x = (
            sp.csr_matrix(
                (arrays["attr_data"], arrays["attr_indices"], arrays["attr_indptr"]),
                shape=tuple(arrays["attr_shape"]),
            )
            .toarray()
            .astype(np.float32)
        )
    elif "attr_matrix" in arrays:
        x = np.asarray(arrays["attr_matrix"], dtype=np.float32)
    y = np.asarray(arrays["labels"], dtype=np.int64)
    if y.shape[0] != n or (x is not None and x.shape[0] != n):
        rows = "none" if x is None else x.shape[0]
        raise DataError(f"{path}: {n} nodes but {y.shape[0]} labels and {rows} feature rows")
    indptr, indices = edges_to_csr(
        adj.row,
        adj.col,
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(path),
    )
    num_classes = int(y.max()) + 1
    train, val, test = per_class_split(y, num_classes, 20, 30, seed)
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
        num_classes=num_classes,
        meta={"format": "gnn-benchmark", "path": str(path), "split_seed": seed, "missing": []},
    )
    return graph.validate()


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
    raw = dataset_dir(root, name) / "raw"
    fname = f"{name.replace('-', '_')}.npz"
    arrays, path = _open_npz(raw, fname, f"{name}.zip")
    keys = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
    _need(arrays, keys, path)
    x = np.asarray(arrays["node_features"], dtype=np.float32)
    y = np.asarray(arrays["node_labels"], dtype=np.int64)
    n = y.shape[0]
    if x.shape[0] != n:
        raise DataError(f"{path}: {x.shape[0]} feature rows but {n} labels")
    edges = np.asarray(arrays["edges"], dtype=np.int64)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DataError(f"{path}: edges have shape {edges.shape}, expected (E, 2)")
    indptr, indices = edges_to_csr(
        edges[:, 0],
        edges[:, 1],
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(path),
    )
    masks = []
    for key in ("train_masks", "val_masks", "test_masks"):
        m = np.asarray(arrays[key], dtype=np.bool_)
        if m.ndim != 2 or m.shape[1] != n or not 0 <= split < m.shape[0]:
            raise DataError(f"{path}: {key} has shape {m.shape}; need split {split} of {n}")
        masks.append(np.ascontiguousarray(m[split]))
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
        num_classes=int(y.max()) + 1,
        meta={"format": "heterophilous", "path": str(path), "split": split, "missing": []},
    )
    return graph.validate()
