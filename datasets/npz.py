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
import zlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fullgraph.datasets.graph import Graph, first_overlap
from fullgraph.datasets.ogb_writer import raw_dir
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


_ZIP_HEADERS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip
_CORRUPT = (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error, KeyError)


def _corrupt(what: str, exc: BaseException) -> DataError:
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno is not None:
        return DataError(f"{what}: cannot read ({exc.strerror or msg}); check the file")
    return DataError(
        f"{what}: not a readable .npz archive ({msg}); it is truncated or corrupted, "
        f"replace it with the dataset's original file"
    )


def _read_npz(source: Path | bytes, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (a file, or its bytes) that loads without pickle.

    Arrays stored as Python objects (names, strings) are skipped: the readers need none.

    Raises:
        DataError: not an ``.npz`` (no zip header: a text file, an ``.npy``), or a truncated or
            corrupted archive; ``what`` names it.
    """
    try:
        if isinstance(source, bytes):
            head = source[:4]
        else:
            with open(source, "rb") as fh:
                head = fh.read(4)
    except OSError as exc:
        raise _corrupt(what, exc) from exc
    if head not in _ZIP_HEADERS:
        raise DataError(
            f"{what}: not an .npz archive (it does not start with a zip header); replace it "
            f"with the dataset's original file"
        )
    out = {}
    try:
        with np.load(
            io.BytesIO(source) if isinstance(source, bytes) else source, allow_pickle=False
        ) as f:
            for k in f.files:
                try:
                    out[k] = f[k]
                except ValueError as exc:
                    if "allow_pickle" not in str(exc):
                        raise
    except _CORRUPT as exc:
        raise _corrupt(what, exc) from exc
    return out


def _open_npz(raw: Path, npz_name: str, zip_name: str) -> tuple[dict, Path]:
    """Numeric arrays of ``raw/npz_name``, or of the npz inside ``raw/zip_name``."""
    npz_path, zip_path = raw / npz_name, raw / zip_name
    if npz_path.is_file():
        return _read_npz(npz_path, str(npz_path)), npz_path
    if zip_path.is_file():
        try:
            with zipfile.ZipFile(zip_path) as z:
                members = [m for m in z.namelist() if m.endswith(".npz")]
                if not members:
                    raise DataError(
                        f"{zip_path}: holds no .npz file (expected {npz_name}); replace it with "
                        f"the dataset's original archive"
                    )
                member = npz_name if npz_name in members else members[0]
                data = z.read(member)
        except _CORRUPT as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if isinstance(exc, OSError) and exc.errno is not None:
                raise DataError(f"{zip_path}: cannot read ({exc.strerror or msg})") from exc
            raise DataError(
                f"{zip_path}: not a readable zip archive ({msg}); it is truncated or "
                f"corrupted, replace it with the dataset's original archive"
            ) from exc
        return _read_npz(data, f"{zip_path} ({member})"), zip_path
    raise DataError(f"missing file: expected {npz_path} (or {zip_path})")


def _need(arrays: dict, keys: tuple[str, ...], path: Path) -> None:
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise DataError(
            f"{path}: missing arrays {missing} (holds {sorted(arrays)}); is it the right file?"
        )


def _numbers(arrays: dict, key: str, path: Path, ndim: int) -> np.ndarray:
    """``arrays[key]`` checked to be a real-valued array of ``ndim`` dimensions."""
    a = arrays[key]
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_) or np.iscomplexobj(a):
        raise DataError(f"{path}: {key} holds {a.dtype} values, expected numbers")
    if a.ndim != ndim:
        raise DataError(f"{path}: {key} has shape {a.shape}, expected {ndim} dimensions")
    return a


def _integers(arrays: dict, key: str, path: Path, ndim: int = 1) -> np.ndarray:
    """``arrays[key]`` as int64, checked to hold whole numbers only."""
    a = _numbers(arrays, key, path, ndim)
    if not np.issubdtype(a.dtype, np.integer) and a.dtype != np.bool_:
        whole = np.isfinite(a) & (a == np.round(a)) & (np.abs(a) < 2**62)
        if not whole.all():
            v = a.reshape(-1)[np.argmin(whole.reshape(-1))].item()
            raise DataError(f"{path}: {key} holds {v!r}, expected integers")
    return a.astype(np.int64, copy=False)


def _finite(a: np.ndarray, key: str, path: Path) -> None:
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        raise DataError(f"{path}: {key} holds NaN or infinite values; features must be finite")


def _labels(arrays: dict, key: str, path: Path, n: int) -> np.ndarray:
    y = _integers(arrays, key, path)
    if y.shape[0] != n:
        raise DataError(f"{path}: {key} has {y.shape[0]} entries but the graph has {n} nodes")
    if y.size and y.min() < 0:
        v = int(np.argmin(y))
        raise DataError(f"{path}: {key} gives node {v} the negative label {int(y[v])}")
    return y


def _csr(arrays: dict, prefix: str, path: Path) -> tuple[np.ndarray, np.ndarray, tuple]:
    """Check the CSR pieces ``<prefix>_{data,indices,indptr,shape}`` before scipy sees them.

    Returns:
        ``(indptr, indices, (rows, cols))``, int64.

    Raises:
        DataError: naming the file and the array: a missing piece, a shape that is not two
            non-negative integers, a row pointer of the wrong length, not starting at 0,
            decreasing or not ending at the number of entries, a column outside the shape,
            data of another length than the indices or not finite.
    """
    _need(arrays, tuple(f"{prefix}_{k}" for k in ("data", "indices", "indptr", "shape")), path)
    shape = _integers(arrays, f"{prefix}_shape", path)
    if shape.shape != (2,) or shape.min() < 0:
        raise DataError(
            f"{path}: {prefix}_shape is {shape.tolist()}, expected two non-negative sizes"
        )
    rows, cols = int(shape[0]), int(shape[1])
    indptr = _integers(arrays, f"{prefix}_indptr", path)
    indices = _integers(arrays, f"{prefix}_indices", path)
    data = _numbers(arrays, f"{prefix}_data", path, 1)
    name = f"{prefix}_indptr"
    if indptr.shape[0] != rows + 1:
        raise DataError(
            f"{path}: {name} has {indptr.shape[0]} entries, expected {prefix}_shape[0] + 1 = "
            f"{rows + 1}"
        )
    if indptr[0] != 0:
        raise DataError(f"{path}: {name} starts at {int(indptr[0])}, expected 0")
    step = np.diff(indptr)
    if step.size and step.min() < 0:
        r = int(np.argmin(step))
        raise DataError(f"{path}: {name} decreases at row {r} (a CSR row pointer never does)")
    if indptr[-1] != indices.shape[0]:
        raise DataError(
            f"{path}: {name} ends at {int(indptr[-1])} but {prefix}_indices has "
            f"{indices.shape[0]} entries"
        )
    if indices.size and (indices.min() < 0 or indices.max() >= cols):
        bad = int(indices.min()) if indices.min() < 0 else int(indices.max())
        raise DataError(
            f"{path}: {prefix}_indices holds column {bad}, outside [0, {cols}) of {prefix}_shape"
        )
    if data.shape[0] != indices.shape[0]:
        raise DataError(
            f"{path}: {prefix}_data has {data.shape[0]} entries but {prefix}_indices has "
            f"{indices.shape[0]}"
        )
    _finite(data, f"{prefix}_data", path)
    return indptr, indices, (rows, cols)


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
    raw = raw_dir(root, name)
    arrays, path = _open_npz(raw, GNN_BENCHMARK_FILES[name], f"{name}.zip")
    _need(arrays, ("adj_data", "adj_indices", "adj_indptr", "adj_shape", "labels"), path)
    indptr, dst, (n, n_cols) = _csr(arrays, "adj", path)
    if n != n_cols:
        raise DataError(f"{path}: adj_shape is [{n}, {n_cols}], an adjacency must be square")
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # as scipy's tocoo().row
    x = None
    if any(f"attr_{k}" in arrays for k in ("data", "indices", "indptr", "shape")):
        f_indptr, f_indices, f_shape = _csr(arrays, "attr", path)
        if f_shape[0] != n:
            raise DataError(f"{path}: attr_shape has {f_shape[0]} rows but adj_shape {n} nodes")
        x = (
            sp.csr_matrix((arrays["attr_data"], f_indices, f_indptr), shape=f_shape)
            .toarray()
            .astype(np.float32)
        )
    elif "attr_matrix" in arrays:
        x = np.asarray(_numbers(arrays, "attr_matrix", path, 2), dtype=np.float32)
        if x.shape[0] != n:
            raise DataError(f"{path}: attr_matrix has {x.shape[0]} rows but adj_shape {n} nodes")
        _finite(x, "attr_matrix", path)
    y = _labels(arrays, "labels", path, n)
    indptr, indices = edges_to_csr(
        src,
        dst,
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=f"{path} (adj_indices)",
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
    raw = raw_dir(root, name)
    fname = f"{name.replace('-', '_')}.npz"
    arrays, path = _open_npz(raw, fname, f"{name}.zip")
    keys = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
    _need(arrays, keys, path)
    n = _numbers(arrays, "node_labels", path, 1).shape[0]
    y = _labels(arrays, "node_labels", path, n)
    x = np.asarray(_numbers(arrays, "node_features", path, 2), dtype=np.float32)
    if x.shape[0] != n:
        raise DataError(f"{path}: node_features has {x.shape[0]} rows but {n} node_labels")
    _finite(x, "node_features", path)
    edges = _integers(arrays, "edges", path, ndim=2)
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
        m = _integers(arrays, key, path, ndim=2)
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
