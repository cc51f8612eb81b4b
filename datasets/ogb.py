"""Reader of the OGB node-property layout (``ogbn-*`` and graphs from ``fullgraph data synth``).

Reads ``<root>/<name with - as _>/raw/{edge,node-feat,node-label,num-node-list,
num-edge-list}.csv.gz`` (and ``edge_feat.csv.gz`` / ``edge_weight.csv.gz`` when present:
per-edge feature rows and weights, carried with their edges) and ``split/<scheme>/{train,
valid,test}.csv.gz`` whole into memory with pyarrow's CSV reader (a progress bar on large
files); a graph too large for that is refused first (:mod:`~fullgraph.datasets.ogb_memory`,
naming ``fullgraph data ingest``). NaN labels (papers100M's unlabelled nodes) become ``-1``.
No download ever happens. Processed arrays are cached as ``.npy`` files in
``<dataset>/processed/<variant>/`` (atomic; loadable with mmap), keyed by the sizes and
modification times of every raw and split file (editing one invalidates the cache); nothing
is written when the dataset directory is not writable (shared read-only copies).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import atomic_dir, atomic_write_json
from fullgraph.datasets.edges import check_edge_ids, edges_to_csr_with_values, index_to_mask
from fullgraph.datasets.graph import GRAPH_ARRAYS, Graph, first_overlap, nonfinite_rows
from fullgraph.datasets.npy_layout import is_npy_dataset, read_npy_dataset
from fullgraph.datasets.ogb_memory import check_in_memory_read
from fullgraph.datasets.ogb_writer import MARKER_FORMAT
from fullgraph.datasets.paths import dataset_dir, raw_dir
from fullgraph.errors import DataError
from fullgraph.resources import drop_resident_pages

log = logging.getLogger(__name__)

#: Split schemes of OGB's node-property datasets, tried in this order when several exist.
KNOWN_SCHEMES = ("time", "sales_history", "species", "random")
_CACHE_VERSION = 1

#: Optional per-edge files of ``raw/``, one row per line of ``edge.csv.gz`` (OGB's
#: ``edge_feat.csv.gz`` of ogbn-proteins; ``edge_weight.csv.gz`` as ogbl-collab names it).
EDGE_VALUE_FILES = {"edge_weight": "edge_weight.csv.gz", "edge_attr": "edge_feat.csv.gz"}


def _require(path: Path) -> Path:
    try:
        is_file = path.is_file()
    except OSError as exc:  # a directory on the way that cannot be searched
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from exc
    if not is_file:
        if path.exists():
            raise DataError(f"{path} is not a regular file; put the dataset's file there")
        raise DataError(f"missing file: expected {path}")
    return path


def _empty_file(exc: BaseException) -> bool:
    """Whether pyarrow failed because the (decompressed) file holds nothing."""
    return isinstance(exc, StopIteration) or "Empty CSV file" in str(exc)


def _read_error(path: Path, dtype: str, exc: BaseException) -> DataError:
    """The one-line :class:`DataError` for a file pyarrow could not read or parse."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, OSError) and exc.errno is not None:
        return DataError(f"{path}: cannot read ({exc.strerror or msg}); check the file")
    if _empty_file(exc):
        return DataError(f"{path}: the file is empty; replace it with an intact copy")
    if isinstance(exc, (OSError, EOFError, zlib.error)):
        kind = "gzip file" if path.suffix == ".gz" else "file"
        return DataError(
            f"{path}: not a readable {kind} ({msg}); it is truncated or corrupted, "
            f"replace it with an intact copy"
        )
    return DataError(f"{path}: cannot parse as CSV of {dtype}: {msg}")


def read_csv_columns(
    path: Path,
    dtype: str,
    total_rows: int | None = None,
    desc: str = "",
    *,
    columns: int | None = None,
    allow_empty: bool = False,
) -> np.ndarray:
    """Read a headerless numeric CSV (plain or ``.gz``) into a 2-D numpy array.

    Args:
        path: the file.
        dtype: arrow type name of every column (``int64``, ``float32``, ``float64``).
        total_rows: expected rows, for the progress bar (``None``: unknown).
        desc: progress-bar label.
        columns: the number of columns the file must have (``None``: any).
        allow_empty: an empty file (no rows: an edgeless graph's ``edge.csv.gz``) is read as
            ``[0, columns]`` rows (``columns`` must be given); otherwise it is refused.

    Returns:
        Array [rows, columns] of the matching numpy dtype.

    Raises:
        DataError: the file is missing, unreadable, truncated or not gzip (``.gz``), empty
            (unless ``allow_empty``), not numeric, ragged, or has another number of columns than
            ``columns``.
    """
    import pyarrow as pa  # only when parsing raw files: ranks never pay its memory
    import pyarrow.csv as pacsv

    _require(path)
    empty = np.zeros((0, columns or 0), dtype=np.dtype(dtype))
    compression = "gzip" if path.suffix == ".gz" else None
    ro = pacsv.ReadOptions(autogenerate_column_names=True, block_size=1 << 24)
    failures = (
        ValueError,  # pa.ArrowInvalid (parse and conversion errors), UnicodeDecodeError
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        pa.ArrowIndexError,
        pa.ArrowKeyError,
        OSError,  # pa.ArrowIOError: truncated or non-gzip stream, unreadable file
        EOFError,
        zlib.error,
        StopIteration,
    )
    try:
        stream = pa.input_stream(str(path), compression=compression)
        try:
            first = pacsv.open_csv(stream, read_options=ro)
            ncols = len(first.schema)
        finally:
            stream.close()
        if columns is not None and ncols != columns:
            raise DataError(
                f"{path}: {ncols} comma-separated columns per row, expected {columns}; "
                f"check that it is the right file"
            )
        arrow_type = pa.type_for_alias(dtype)
        co = pacsv.ConvertOptions(column_types={f"f{j}": arrow_type for j in range(ncols)})
        stream = pa.input_stream(str(path), compression=compression)
        try:
            reader = pacsv.open_csv(stream, read_options=ro, convert_options=co)
            chunks = []
            show = total_rows is not None and total_rows * ncols >= 20_000_000
            with tqdm(
                total=total_rows,
                desc=desc or path.name,
                unit="row",
                unit_scale=True,
                leave=False,
                disable=None if show else True,  # None: only on a terminal
            ) as bar:
                for batch in reader:
                    cols = [c.to_numpy(zero_copy_only=False) for c in batch.columns]
                    chunks.append(np.stack(cols, axis=1) if ncols > 1 else cols[0][:, None])
                    bar.update(batch.num_rows)
        finally:
            stream.close()
    except failures as exc:
        if allow_empty and columns and _empty_file(exc):
            return empty
        raise _read_error(path, dtype, exc) from exc
    rows = sum(c.shape[0] for c in chunks)
    if rows == 0 and allow_empty and columns:
        return empty
    if rows == 0:
        raise DataError(f"{path}: the file holds no rows; replace it with an intact copy")
    out = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    if dtype.startswith("int") and not np.issubdtype(out.dtype, np.integer):
        line = int(np.argmax(np.isnan(out).any(axis=1))) + 1  # the nulls read as NaN
        raise DataError(
            f"{path}: line {line} has an empty field (or 'nan') where an integer belongs"
        )
    return np.ascontiguousarray(out)


def refuse_non_finite(path: Path, values: np.ndarray, row: str) -> None:
    """Raise :class:`DataError` naming ``path`` and its first line that holds a value that is
    not a finite float32 (NaN, an infinity, or a number beyond float32's range such as 1e308,
    which reading turned into an infinity).

    Args:
        path: the file the rows were read from, one row per line.
        values: its rows, float32 [rows] or [rows, columns].
        row: what a row is, for the message (``node``, ``edge``).
    """
    bad = nonfinite_rows(values.reshape(values.shape[0], -1))
    if bad.size:
        first = int(bad[0])
        raise DataError(
            f"{path}: line {first + 1} ({row} {first}) holds a value that is not a finite "
            f"float32 (NaN, inf, or beyond +-3.4e38), {bad.size} such line(s) in all; values "
            f"must be finite"
        )


def _read_count(path: Path, least: int) -> int:
    """The single integer of a ``num-*-list.csv.gz`` file (``>= least``)."""
    vals = read_csv_columns(path, "int64", columns=1)
    if vals.shape[0] != 1:
        raise DataError(
            f"{path}: {vals.shape[0]} rows, expected one count (only single-graph node "
            f"property datasets are read)"
        )
    count = int(vals[0, 0])
    if count < least:
        raise DataError(f"{path}: count {count} is below {least}; the file is wrong")
    return count


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
        marker = json.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (not UTF-8 text)") from exc
    if not isinstance(marker, dict):
        raise DataError(f"{path}: expected a JSON object, found {type(marker).__name__}")
    if marker.get("format") != MARKER_FORMAT:
        raise DataError(f"{path}: unknown format {marker.get('format')!r}")
    classes = marker.get("num_classes")
    if classes is not None and (
        isinstance(classes, bool) or not isinstance(classes, int) or classes < 0
    ):
        raise DataError(f"{path}: num_classes must be a non-negative integer, got {classes!r}")
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
        for a in GRAPH_ARRAYS:
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
    n_path, m_path = raw / "num-node-list.csv.gz", raw / "num-edge-list.csv.gz"
    n = _read_count(_require(n_path), 1)
    m = _read_count(_require(m_path), 0)
    says = f"{n_path.name} says {n} nodes"
    log.info("%s: reading %d edges of %d nodes", name, m, n)
    # labels first: a small file whose row count tells a wrong node count cheaply
    label_path = _require(raw / "node-label.csv.gz")
    yf = read_csv_columns(label_path, "float64", n, f"{name} labels")
    if yf.shape[1] != 1:
        raise DataError(f"{label_path}: {yf.shape[1]} label columns; only single-label is read")
    yf = yf[:, 0]
    if yf.shape[0] != n:
        raise DataError(
            f"{label_path}: {yf.shape[0]} labels but {n} nodes ({n_path.name}); one of the two "
            f"files is wrong"
        )
    y = label_ids(label_path, yf)
    check_in_memory_read(d, name, n, m)  # the node count checked; before the large files
    edge_path = raw / "edge.csv.gz"
    # an edgeless graph (num-edge-list says 0) is valid: its edge file is empty
    edges = read_csv_columns(
        _require(edge_path), "int64", m, f"{name} edges", columns=2, allow_empty=m == 0
    )
    if edges.shape[0] != m:
        raise DataError(f"{edge_path}: {edges.shape[0]} edges but num-edge-list says {m}")
    src, dst = edges[:, 0].copy(), edges[:, 1].copy()
    del edges
    try:  # an id out of range: this file or num-node-list.csv.gz is wrong
        check_edge_ids(src, dst, n, str(edge_path))
    except DataError as exc:
        raise DataError(f"{exc} ({says}; one of the two files is wrong)") from None
    values = _edge_values(raw, name, m)  # each file checked by itself (its own name, its rows)
    indptr, indices, values = edges_to_csr_with_values(
        src,
        dst,
        n,
        values,
        symmetric=symmetric,
        remove_self_loops=remove_self_loops,
        what=f"{edge_path} with {', '.join(EDGE_VALUE_FILES[k] for k in values)}",
    )
    del src, dst
    x = None
    feat = raw / "node-feat.csv.gz"
    if feat.is_file() or marker.get("has_features", True):
        x = read_csv_columns(_require(feat), "float32", n, f"{name} features")
        if x.shape[0] != n:
            raise DataError(
                f"{feat}: {x.shape[0]} feature rows but {n} nodes ({n_path.name}); one of the "
                f"two files is wrong"
            )
        refuse_non_finite(feat, x, "node")
    masks = read_split_masks(d, marker, n, says)
    return {
        "indptr": indptr,
        "indices": indices,
        "x": x,
        "y": y,
        **masks,
        "edge_weight": values.get("edge_weight"),
        "edge_attr": values.get("edge_attr"),
    }


def label_ids(path: Path, yf: np.ndarray, first: int = 0) -> np.ndarray:
    """The int64 labels of the float64 rows ``yf`` of ``path``, its nodes ``first`` onwards
    (NaN, OGB's unlabelled: ``-1``); :class:`DataError` for an infinite, negative, fractional
    or too large label."""
    infinite = np.isinf(yf)  # NaN is OGB's "unlabelled"; an infinity is a damaged row
    if infinite.any():
        v = int(np.argmax(infinite))
        raise DataError(
            f"{path}: line {first + v + 1} (node {first + v}) holds label {yf[v]:g}; a label "
            f"is a class id (or NaN for an unlabelled node)"
        )
    labelled = np.isfinite(yf)
    if labelled.any() and (yf[labelled] < 0).any():
        raise DataError(f"{path}: negative label {yf[labelled].min():g}")
    fractional = labelled & (yf != np.floor(np.where(labelled, yf, 0)))
    if fractional.any():
        v = int(np.argmax(fractional))
        raise DataError(f"{path}: label {yf[v]:g} of node {first + v} is not an integer class id")
    if labelled.any() and yf[labelled].max() >= 2**31:
        raise DataError(f"{path}: label {yf[labelled].max():g} is too large")
    return np.where(labelled, yf, -1).astype(np.int64)


def read_split_masks(d: Path, marker: dict, n: int, says: str) -> dict[str, np.ndarray]:
    """The ``*_mask`` arrays of ``d``'s ``split/<scheme>/`` for ``n`` nodes (``says``: where
    ``n`` comes from, for messages); :class:`DataError` for a missing or malformed split file,
    an id out of range, a node in two splits."""
    split = _split_dir(d, marker)
    masks = {}
    for key, fname in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        p = _require(split / f"{fname}.csv.gz")
        ids = read_csv_columns(p, "int64", columns=1)[:, 0]
        try:
            masks[key] = index_to_mask(ids, n, str(p))
        except DataError as exc:
            raise DataError(f"{exc} ({says})") from None
    overlap = first_overlap(masks)
    if overlap is not None:
        a, b, v = overlap
        files = {"train_mask": "train", "val_mask": "valid", "test_mask": "test"}
        raise DataError(
            f"{split}: node {v} is in both {files[a]}.csv.gz and {files[b]}.csv.gz; "
            f"a node may be in one split only"
        )
    return masks


def _edge_values(raw: Path, name: str, m: int) -> dict[str, np.ndarray]:
    """The per-edge files of ``raw/`` that exist (:data:`EDGE_VALUE_FILES`), ``m`` rows each."""
    values = {}
    for key, fname in EDGE_VALUE_FILES.items():
        path = raw / fname
        if not path.is_file():
            continue
        weight = key == "edge_weight"  # one number per edge
        v = read_csv_columns(
            path,
            "float32",
            m,
            f"{name} {key}",
            columns=1 if weight else None,
            allow_empty=weight and m == 0,
        )
        if v.shape[0] != m:
            raise DataError(f"{path}: {v.shape[0]} rows but num-edge-list says {m} edges")
        refuse_non_finite(path, v, "edge")
        values[key] = v.reshape(-1) if weight else v
    return values


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
    npy = dataset_dir(root, name)
    if is_npy_dataset(npy):  # the chunked synthetic writer's arrays
        return read_npy_dataset(npy, name, mmap=mmap)
    d = raw_dir(root, name).parent
    marker = read_marker(d)
    variant = ("sym" if symmetric else "dir") + ("" if remove_self_loops else "-loops")
    cache_dir = d / "processed" / variant
    key = _cache_key(d, variant)
    arrays = _load_cache(cache_dir, key, mmap) if cache else None
    parsed = arrays is None
    if parsed:
        arrays = _parse(d, name, marker, symmetric, remove_self_loops)
    else:
        log.info("%s: loaded processed arrays from %s", name, cache_dir)
    y = arrays["y"]
    labelled = y[y >= 0]
    top = int(labelled.max()) if labelled.size else -1
    num_classes = int(marker.get("num_classes", top + 1))
    if top >= num_classes:
        raise DataError(
            f"{d / 'meta.json'}: num_classes is {num_classes} but "
            f"{d / 'raw' / 'node-label.csv.gz'} holds label {top}; one of the two files is wrong"
        )
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
    graph.validate()
    if parsed and cache:  # only what passed every check is cached
        _save_cache(cache_dir, key, arrays)
    if mmap and not parsed:
        # validation read every page; do not keep them all resident in this process
        for array in arrays.values():
            drop_resident_pages(array)
    return graph
