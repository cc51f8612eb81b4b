"""Reader of the OGB node-property layout (``ogbn-*`` and graphs from ``fullgraph data synth``).

Reads ``<root>/<name with - as _>/raw/{edge,node-feat,node-label,num-node-list,
num-edge-list}.csv.gz`` and ``split/<scheme>/{train,valid,test}.csv.gz`` with pyarrow's CSV
reader (streamed from gzip, parsed on several threads, a progress bar on large files). Labels
that are NaN (unlabelled nodes of papers100M) become ``-1``. No download ever happens.

Processed arrays are cached as ``.npy`` files in ``<dataset>/processed/<variant>/`` (written
atomically; loadable with mmap), keyed by the sizes and modification times of every raw and
split file, so editing a raw file invalidates the cache. Nothing is written when the dataset
directory is not writable (shared read-only copies).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import atomic_dir, atomic_write_json
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_writer import MARKER_FORMAT, dataset_dir
from fullgraph.datasets.ops import edges_to_csr, index_to_mask
from fullgraph.errors import DataError

log = logging.getLogger(__name__)

#: Split schemes of OGB's node-property datasets, tried in this order when several exist.
KNOWN_SCHEMES = ("time", "sales_history", "species", "random")
_CACHE_VERSION = 1
_ARRAYS = ("indptr", "indices", "x", "y", "train_mask", "val_mask", "test_mask")


def _require(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"missing file: expected {path}")
    return path


def read_csv_columns(
    path: Path, dtype: str, total_rows: int | None = None, desc: str = ""
) -> np.ndarray:
    """Read a headerless numeric CSV (plain or ``.gz``) into a 2-D numpy array.

    Args:
        path: the file.
        dtype: arrow type name of every column (``int64``, ``float32``, ``float64``).
        total_rows: expected rows, for the progress bar (``None``: unknown).
        desc: progress-bar label.

    Returns:
        Array [rows, columns] of the matching numpy dtype.

    Raises:
        DataError: the file is missing, empty or not numeric.
    """
    import pyarrow as pa  # only when parsing raw files: ranks never pay its memory
    import pyarrow.csv as pacsv

    _require(path)
    compression = "gzip" if path.suffix == ".gz" else None
    ro = pacsv.ReadOptions(autogenerate_column_names=True, block_size=1 << 24)
    try:
        stream = pa.input_stream(str(path), compression=compression)
        first = pacsv.open_csv(stream, read_options=ro)
        ncols = len(first.schema)
        stream.close()
        arrow_type = pa.type_for_alias(dtype)
        co = pacsv.ConvertOptions(column_types={f"f{j}": arrow_type for j in range(ncols)})
        stream = pa.input_stream(str(path), compression=compression)
        reader = pacsv.open_csv(stream, read_options=ro, convert_options=co)
        chunks = []
        show = total_rows is not None and total_rows * ncols >= 20_000_000
        with tqdm(
            total=total_rows,
            desc=desc or path.name,
            unit="row",
            unit_scale=True,
            leave=False,
            disable=not show,
        ) as bar:
            for batch in reader:
                cols = [c.to_numpy(zero_copy_only=False) for c in batch.columns]
                chunks.append(np.stack(cols, axis=1) if ncols > 1 else cols[0][:, None])
                bar.update(batch.num_rows)
        stream.close()
    except (pa.ArrowInvalid, StopIteration) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "empty file"
        raise DataError(f"{path}: cannot parse as CSV of {dtype}: {msg}") from exc
    if not chunks:
        raise DataError(f"{path}: file holds no rows")
    out = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    return np.ascontiguousarray(out)


def _read_count(path: Path) -> int:
    vals = read_csv_columns(path, "int64")
    return int(vals[0, 0])


def _split_dir(d: Path, marker: dict) -> Path:
    split_root = d / "split"
    if not split_root.is_dir():
        raise DataError(f"missing directory: expected {split_root}/<scheme>/")
    schemes = sorted(p.name for p in split_root.iterdir() if p.is_dir())
    if not schemes:
        raise DataError(f"no split scheme directory in {split_root}")
    wanted = marker.get("split_scheme")
    if wanted in schemes:
        return split_root / wanted
    if len(schemes) == 1:
        return split_root / schemes[0]
    for s in KNOWN_SCHEMES:
        if s in schemes:
            return split_root / s
    raise DataError(f"{split_root}: several split schemes {schemes}, none of {KNOWN_SCHEMES}")


def read_marker(d: Path) -> dict:
    """The ``meta.json`` marker fullgraph writes beside OGB-layout data (``{}`` if absent)."""
    path = d / "meta.json"
    if not path.is_file():
        return {}
    try:
        marker = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if marker.get("format") != MARKER_FORMAT:
        raise DataError(f"{path}: unknown format {marker.get('format')!r}")
    return marker


def _cache_key(d: Path, variant: str) -> dict:
    files = {}
    for sub in ("raw", "split"):
        for p in sorted((d / sub).rglob("*")):
            if p.is_file():
                st = p.stat()
                files[str(p.relative_to(d))] = [st.st_size, st.st_mtime_ns]
    marker = d / "meta.json"
    if marker.is_file():
        st = marker.stat()
        files["meta.json"] = [st.st_size, st.st_mtime_ns]
    return {"version": _CACHE_VERSION, "variant": variant, "files": files}


def _load_cache(cache: Path, key: dict, mmap: bool) -> dict | None:
    try:
        if json.loads((cache / "key.json").read_text()) != key:
            return None
        mode = "r" if mmap else None
        arrays = {}
        for a in _ARRAYS:
            p = cache / f"{a}.npy"
            arrays[a] = np.load(p, mmap_mode=mode) if p.exists() else None
        return arrays
    except (OSError, ValueError):
        return None


def _save_cache(cache: Path, key: dict, arrays: dict) -> None:
    if not os.access(cache.parent.parent, os.W_OK):
        log.info("not caching: %s is not writable", cache.parent.parent)
        return
    try:
        with atomic_dir(cache, force=True) as tmp:
            for a, v in arrays.items():
                if v is not None:
                    np.save(tmp / f"{a}.npy", v)
            atomic_write_json(tmp / "key.json", key)
    except OSError as exc:
        log.info("not caching %s: %s", cache, exc)


def _parse(d: Path, name: str, marker: dict, symmetric: bool, remove_self_loops: bool) -> dict:
    raw = d / "raw"
    n = _read_count(_require(raw / "num-node-list.csv.gz"))
    m = _read_count(_require(raw / "num-edge-list.csv.gz"))
    log.info("%s: reading %d edges of %d nodes", name, m, n)
    edges = read_csv_columns(_require(raw / "edge.csv.gz"), "int64", m, f"{name} edges")
    if edges.shape[1] != 2:
        raise DataError(f"{raw / 'edge.csv.gz'}: expected 2 columns, found {edges.shape[1]}")
    if edges.shape[0] != m:
        raise DataError(f"{raw / 'edge.csv.gz'}: {edges.shape[0]} edges but num-edge-list says {m}")
    src, dst = edges[:, 0].copy(), edges[:, 1].copy()
    del edges
    indptr, indices = edges_to_csr(
        src,
        dst,
        n,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=str(raw / "edge.csv.gz"),
    )
    del src, dst
    x = None
    feat = raw / "node-feat.csv.gz"
    if feat.is_file() or marker.get("has_features", True):
        x = read_csv_columns(_require(feat), "float32", n, f"{name} features")
        if x.shape[0] != n:
            raise DataError(f"{feat}: {x.shape[0]} feature rows but {n} nodes")
    label_path = _require(raw / "node-label.csv.gz")
    yf = read_csv_columns(label_path, "float64", n, f"{name} labels")
    if yf.shape[1] != 1:
        raise DataError(f"{label_path}: {yf.shape[1]} label columns; only single-label is read")
    yf = yf[:, 0]
    if yf.shape[0] != n:
        raise DataError(f"{label_path}: {yf.shape[0]} labels but {n} nodes")
    labelled = np.isfinite(yf)
    if labelled.any() and (yf[labelled] < 0).any():
        raise DataError(f"{label_path}: negative label {yf[labelled].min():g}")
    y = np.where(labelled, yf, -1).astype(np.int64)
    split = _split_dir(d, marker)
    masks = {}
    for key, fname in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        p = _require(split / f"{fname}.csv.gz")
        masks[key] = index_to_mask(read_csv_columns(p, "int64")[:, 0], n, str(p))
    return {"indptr": indptr, "indices": indices, "x": x, "y": y, **masks}


def read_ogb(
    root: str | Path,
    name: str,
    *,
    symmetric: bool = True,
    remove_self_loops: bool = True,
    cache: bool = True,
    mmap: bool = False,
) -> Graph:
    """Load an OGB-layout node-property dataset.

    Args:
        root: dataset root; the data is in ``<root>/<name with - as _>/``.
        name: dataset name (``ogbn-arxiv``, or a name given to ``fullgraph data synth``).
        symmetric: add reverse edges (OGB's arxiv and papers100M are directed on disk).
        remove_self_loops: drop ``v -> v`` edges.
        cache: read and write the ``processed/`` ``.npy`` cache.
        mmap: memory-map the cached arrays (read-only) instead of reading them.

    Returns:
        The graph; ``meta["source"]`` holds the generator parameters of synthetic graphs.

    Raises:
        DataError: missing files (path named), malformed or inconsistent contents.
    """
    d = dataset_dir(root, name)
    if not d.is_dir():
        raise DataError(f"dataset {name!r} not found: expected directory {d}")
    marker = read_marker(d)
    variant = ("sym" if symmetric else "dir") + ("" if remove_self_loops else "-loops")
    cache_dir = d / "processed" / variant
    key = _cache_key(d, variant)
    arrays = _load_cache(cache_dir, key, mmap) if cache else None
    if arrays is not None:
        log.info("%s: loaded processed arrays from %s", name, cache_dir)
    else:
        arrays = _parse(d, name, marker, symmetric, remove_self_loops)
        if cache:
            _save_cache(cache_dir, key, arrays)
    y = arrays["y"]
    labelled = y[y >= 0]
    num_classes = int(marker.get("num_classes", int(labelled.max()) + 1 if labelled.size else 0))
    meta = {"format": "ogb", "path": str(d), "symmetric": symmetric, "missing": []}
    if "source" in marker:
        meta["source"] = marker["source"]
    if arrays["x"] is None:
        meta["missing"].append("features")
        log.warning("%s: no node features on disk (x is None)", name)
    graph = Graph(
        name=name,
        num_nodes=int(arrays["indptr"].shape[0] - 1),
        num_classes=num_classes,
        meta=meta,
        **arrays,
    )
    return graph.validate()
