"""Out-of-core ingest of the OGB node-property layout into the ``npy`` layout.

:func:`ingest_ogb` reads ``raw/*.csv.gz`` and ``split/<scheme>/*.csv.gz`` of a dataset that
:func:`fullgraph.datasets.ogb.read_ogb` reads (``ogbn-*``, ``fullgraph data synth``'s CSV
graphs) and writes the same graph, symmetrised without self loops as ``read_ogb`` gives it by
default, in the ``npy`` layout (:mod:`fullgraph.datasets.npy_layout`), without ever holding
the edges or the features. Every CSV file is streamed with pyarrow's CSV reader, a block
(:data:`BLOCK_BYTES` of text) at a time; errors are one line naming the file (and the line
for ids, labels and feature values; for a truncated gzip or a ragged row, how many lines read
fine before it). Stages, each logged:

- **labels** (NaN: ``-1``) and **splits**, checked as ``read_ogb`` checks them;
- **edges**, two passes: the file's rows checked (ids in range, by line) and turned into keys
  ``min * N + max`` without self loops, written to one scratch file while the keys per
  ``min`` are counted; then the keys go to bucket files whose bounds are exact from that
  count (:func:`~fullgraph.datasets.synthetic_chunked.bounds_from_counts`: at most
  ``BUCKET_KEYS`` keys per bucket, or one id's keys, on any id order), each sorted and made
  distinct alone, and the CSR is built range of rows by range from the key file as the
  chunked synthetic writer builds it (``_write_csr``);
- **features**, block by block into the memory-mapped ``x.npy`` (float32, or float16: a
  value beyond float16's range is refused with its line), non-finite rows refused.

Memory bound: about :data:`NODE_BYTES` bytes per node (labels, masks, the key counts, then
the CSR's degrees, offsets and counts per ``hi``; a one-id bucket's presence array) plus
:data:`CHUNK_BYTES` for chunk buffers (a bucket being sorted, a range of CSR rows, a CSV
block), whatever the edge count and the feature width; written pages of the maps are
unmapped every ``RELEASE_BYTES``. Measured figures: docs/datasets.md. Disk: the dataset plus
scratch files of at most 16 bytes per edge line at once. Everything (the scratch
files included) is written inside the temporary directory that becomes the dataset, so an
interrupted run (Ctrl-C, SIGTERM through the CLI, a full disk) leaves no dataset.

Refused, one line each: per-edge files (``edge_weight.csv.gz``, ``edge_feat.csv.gz``) and a
directed reading (``symmetric=False``): the ``npy`` layout holds a symmetric graph without
edge values; the in-memory reader reads those.
"""

from __future__ import annotations

import logging
import os
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import Place, atomic_dir, atomic_write_json, check_apart
from fullgraph.datasets import synthetic_chunked as chunked
from fullgraph.datasets.edges import check_edge_ids
from fullgraph.datasets.graph import nonfinite_rows
from fullgraph.datasets.npy_layout import FEATURE_DTYPES, LAYOUT, is_npy_dataset
from fullgraph.datasets.ogb import (
    EDGE_VALUE_FILES,
    _empty_file,
    _read_count,
    _read_error,
    _require,
    _split_dir,
    label_ids,
    read_marker,
    read_split_masks,
)
from fullgraph.datasets.ogb_writer import ARRAYS_DIR, DATASET, MARKER_FORMAT
from fullgraph.datasets.paths import dataset_dir, dataset_inputs, raw_dir
from fullgraph.errors import ConfigError, DataError

__all__ = [
    "BLOCK_BYTES",
    "CHUNK_BYTES",
    "NODE_BYTES",
    "default_name",
    "ingest_ogb",
    "source_nodes",
    "stream_csv",
]

log = logging.getLogger(__name__)

#: Bytes of CSV text pyarrow parses per block (one block per yielded array); small, since
#: pyarrow's streaming reader of a gzip file holds many blocks' worth in flight.
BLOCK_BYTES = 1 << 22
#: Bytes per node the ingest keeps in memory at most (the bound, docs/datasets.md).
NODE_BYTES = 48
#: Bytes of chunk-sized buffers besides (a bucket being sorted, CSR rows, CSV blocks).
CHUNK_BYTES = 1 << 30
#: Largest node count whose keys ``min * N + max`` fit in int64.
_MAX_NODES = 3_037_000_499

_FAILURES: tuple[type[BaseException], ...] = (
    ValueError,  # pa.ArrowInvalid (parse and conversion errors), UnicodeDecodeError
    TypeError,  # pa.ArrowTypeError
    NotImplementedError,  # pa.ArrowNotImplementedError
    IndexError,
    KeyError,
    OSError,  # pa.ArrowIOError: a truncated or non-gzip stream, an unreadable file
    EOFError,
    zlib.error,
)


def default_name(name: str) -> str:
    """The name :func:`ingest_ogb` gives the ``npy`` copy of dataset ``name``."""
    return f"{name}-npy"


def _located(exc: BaseException, path: Path, dtype: str, rows: int) -> DataError:
    """:func:`~fullgraph.datasets.ogb._read_error` with how many lines read fine before."""
    err = _read_error(path, dtype, exc)
    return DataError(f"{err} (the error follows line {rows:,})") if rows else err


def stream_csv(
    path: Path,
    dtype: str,
    *,
    columns: int | None = None,
    allow_empty: bool = False,
    total_rows: int | None = None,
    desc: str = "",
) -> Iterator[tuple[int, np.ndarray]]:
    """The rows of a headerless numeric CSV (plain or ``.gz``), a block at a time.

    Args:
        path: the file.
        dtype: arrow type name of every column (``int64``, ``float32``, ``float64``).
        columns: the number of columns the file must have (``None``: any).
        allow_empty: an empty file yields nothing instead of being refused.
        total_rows: expected rows, for the progress bar (``None``: unknown).
        desc: progress-bar label.

    Yields:
        ``(first, block)``: the 0-based row of the block's first line and the block
        [rows, columns] of the matching numpy dtype.

    Raises:
        DataError: the file is missing, unreadable, truncated or not gzip, empty (unless
            ``allow_empty``), not numeric, ragged, has an empty integer field, or another
            number of columns than ``columns``.
    """
    import pyarrow as pa  # only when parsing raw files
    import pyarrow.csv as pacsv

    _require(path)
    compression = "gzip" if path.suffix == ".gz" else None
    ro = pacsv.ReadOptions(autogenerate_column_names=True, block_size=BLOCK_BYTES)
    try:
        stream = pa.input_stream(str(path), compression=compression)
        try:
            ncols = len(pacsv.open_csv(stream, read_options=ro).schema)
        finally:
            stream.close()
    except (*_FAILURES, StopIteration) as exc:
        if allow_empty and _empty_file(exc):
            return
        raise _read_error(path, dtype, exc) from exc
    if columns is not None and ncols != columns:
        raise DataError(
            f"{path}: {ncols} comma-separated columns per row, expected {columns}; "
            f"check that it is the right file"
        )
    arrow_type = pa.type_for_alias(dtype)
    co = pacsv.ConvertOptions(column_types={f"f{j}": arrow_type for j in range(ncols)})
    integer = dtype.startswith("int")
    rows = 0
    show = total_rows is not None and total_rows * ncols >= 20_000_000
    stream = pa.input_stream(str(path), compression=compression)
    bar = tqdm(
        total=total_rows,
        desc=desc or path.name,
        unit="row",
        unit_scale=True,
        leave=False,
        disable=None if show else True,  # None: only on a terminal
    )
    try:
        try:
            reader = pacsv.open_csv(stream, read_options=ro, convert_options=co)
        except _FAILURES as exc:
            raise _read_error(path, dtype, exc) from exc
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except _FAILURES as exc:
                raise _located(exc, path, dtype, rows) from exc
            if integer and any(c.null_count for c in batch.columns):
                nulls = np.zeros(batch.num_rows, dtype=np.bool_)
                for c in batch.columns:
                    nulls |= c.is_null().to_numpy(zero_copy_only=False)
                line = rows + int(np.argmax(nulls)) + 1
                raise DataError(
                    f"{path}: line {line} has an empty field (or 'nan') where an integer belongs"
                )
            cols = [c.to_numpy(zero_copy_only=False) for c in batch.columns]
            block = np.stack(cols, axis=1) if ncols > 1 else cols[0][:, None]
            del cols, batch
            yield rows, block
            rows += block.shape[0]
            bar.update(block.shape[0])
    finally:
        bar.close()
        stream.close()
    if rows == 0 and not allow_empty:
        raise DataError(f"{path}: the file holds no rows; replace it with an intact copy")


def _read_labels(path: Path, n: int, n_name: str) -> tuple[np.ndarray, int]:
    """Labels int64 [n] (``-1``: unlabelled) streamed from ``path``, and the largest label."""
    y = np.full(n, -1, dtype=np.int64)
    rows = 0
    for first, block in stream_csv(path, "float64", total_rows=n, desc="labels"):
        if block.shape[1] != 1:
            raise DataError(f"{path}: {block.shape[1]} label columns; only single-label is read")
        ids = label_ids(path, block[:, 0], first)
        if first < n:
            y[first : first + ids.shape[0]] = ids[: n - first]
        rows = first + ids.shape[0]
    if rows != n:
        raise DataError(
            f"{path}: {rows} labels but {n} nodes ({n_name}); one of the two files is wrong"
        )
    return y, int(y.max(initial=-1))


def _count_sorted(counts: np.ndarray, ids: np.ndarray) -> None:
    """``counts[v] += (ids == v).sum()`` for every ``v``, through a sort (no N temporary)."""
    ids.sort()
    first = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]])) if ids.size else ids
    counts[ids[first]] += np.diff(np.append(first, ids.shape[0]))


def _edge_keys(path: Path, n: int, m: int, says: str, scratch: Path) -> tuple[Path, np.ndarray]:
    """Pass 1: the keys ``min * n + max`` of the edges without self loops, in one scratch
    file, and the number of keys per ``min``; every line's ids checked, the lines counted."""
    out = scratch / "edge-keys.bin"
    counts = np.zeros(n, dtype=np.int64)
    rows = 0
    with open(out, "wb") as sink:
        for first, block in stream_csv(
            path, "int64", columns=2, allow_empty=m == 0, total_rows=m, desc="edges"
        ):
            rows = first + block.shape[0]
            u, v = block[:, 0], block[:, 1]
            try:  # an id out of range: this file or num-node-list.csv.gz is wrong
                check_edge_ids(u, v, n, str(path), first_line=first)
            except DataError as exc:
                raise DataError(f"{exc} ({says}; one of the two files is wrong)") from None
            keep = u != v
            lo, hi = np.minimum(u[keep], v[keep]), np.maximum(u[keep], v[keep])
            del block, u, v, keep
            (lo * np.int64(n) + hi).tofile(sink)
            del hi
            _count_sorted(counts, lo)
    if rows != m:
        raise DataError(f"{path}: {rows} edges but num-edge-list says {m}")
    return out, counts


def _write_edges(path: Path, n: int, m: int, says: str, scratch: Path, arrays: Path) -> int:
    """``indptr.npy`` and ``indices.npy`` of the symmetric graph of ``path``'s edges without
    self loops or duplicates; the number of CSR entries."""
    raw, counts = _edge_keys(path, n, m, says, scratch)
    total = int(counts.sum())
    bounds = chunked.bounds_from_counts(counts, n)
    del counts
    log.info("edges: %d keys into %d buckets", total, bounds.shape[0] + 1)
    store = chunked.KeysOnDisk(scratch, n, total, bounds=bounds)
    for chunk in chunked._key_chunks(raw, 0, total):
        store.add(chunk)
    raw.unlink()
    distinct = store.merge()
    keys, count = store.finish(iter(()))
    log.info("edges: %d distinct undirected edges; building the CSR", distinct)
    with chunked._bar(2 * count, "csr", "entry") as bar:
        nnz = chunked._write_csr(keys, count, n, arrays, bar)
    keys.unlink()
    return nnz


def _refuse_row(path: Path, row: int, what: str) -> None:
    raise DataError(f"{path}: line {row + 1} (node {row}) {what}")


def _write_features(path: Path, n: int, n_name: str, arrays: Path, dtype: str) -> int:
    """``x.npy`` [n, F] of ``dtype`` streamed from ``path``; the width ``F``."""
    x = None
    rows = written = 0
    half = np.dtype(dtype) == np.float16
    for first, block in stream_csv(path, "float32", total_rows=n, desc="features"):
        rows = first + block.shape[0]
        bad = nonfinite_rows(block)
        if bad.size:
            _refuse_row(
                path,
                first + int(bad[0]),
                "holds a value that is not a finite float32 (NaN, inf, or beyond +-3.4e38); "
                "values must be finite",
            )
        if half:
            with np.errstate(over="ignore"):  # overflow is refused just below, by its line
                values = block.astype(np.float16)
        else:
            values = block
        if half:
            over = nonfinite_rows(values)
            if over.size:
                r = int(over[0])
                big = float(block[r][np.argmax(np.abs(block[r]))])
                _refuse_row(
                    path,
                    first + r,
                    f"holds {big:g}, beyond float16's range (+-65504); ingest with "
                    f"--feature-dtype float32",
                )
        if x is None:
            x = np.lib.format.open_memmap(
                arrays / "x.npy", "w+", np.dtype(dtype), (n, block.shape[1])
            )
        if first < n:  # rows beyond n are only counted, for the message
            x[first : min(n, rows)] = values[: n - first]
            written += values.nbytes
        if written >= chunked.RELEASE_BYTES:
            chunked._release(x)
            written = 0
    if rows != n:
        raise DataError(
            f"{path}: {rows} feature rows but {n} nodes ({n_name}); one of the two files is wrong"
        )
    chunked._release(x)
    width = int(x.shape[1])
    del x
    return width


def source_nodes(root: str | Path, name: str, symmetric: bool = True) -> tuple[Path, int]:
    """The directory and node count of the OGB-layout dataset ``name`` that
    :func:`ingest_ogb` would read, refusing (before any work) what the ``npy`` layout cannot
    hold.

    Raises:
        ConfigError: a dataset in the ``npy`` layout already, edge-value files, a directed
            reading.
        DataError: a missing dataset or node count, or more nodes than int64 keys allow.
    """
    if is_npy_dataset(dataset_dir(root, name)):
        raise ConfigError(f"{dataset_dir(root, name)} is in the npy layout already")
    d = raw_dir(root, name).parent
    fix = "read this dataset with the in-memory reader (fullgraph.datasets.load) instead"
    if not symmetric:
        raise ConfigError(
            f"{d}: the npy layout holds the symmetrised graph; for a directed reading {fix}"
        )
    for fname in EDGE_VALUE_FILES.values():
        if (d / "raw" / fname).exists():
            raise ConfigError(
                f"{d / 'raw' / fname}: the npy layout holds no edge values (a symmetric graph "
                f"without per-edge files); {fix}"
            )
    n_path = d / "raw" / "num-node-list.csv.gz"
    n = _read_count(_require(n_path), 1)
    if n > _MAX_NODES:
        raise DataError(f"{n_path}: {n} nodes; ingest takes at most {_MAX_NODES:,}")
    return d, n


def ingest_ogb(
    root: str | Path,
    name: str,
    *,
    out_root: str | Path | None = None,
    out_name: str | None = None,
    feature_dtype: str = "float32",
    force: bool = False,
    symmetric: bool = True,
) -> Path:
    """Convert an OGB-layout dataset to the ``npy`` layout chunk by chunk, atomically.

    Args:
        root: the dataset root; the source is ``<root>/<name with - as _>/``.
        name: the dataset's name (``ogbn-papers100M``).
        out_root: the root to write into (default ``root``).
        out_name: the new dataset's name (default :func:`default_name`).
        feature_dtype: ``float32`` or ``float16`` on disk.
        force: replace an existing output that fullgraph wrote.
        symmetric: must be true (the layout's graph is symmetric); false is refused.

    Returns:
        The new dataset directory; ``load(out_name, out_root)`` reads it.

    Raises:
        ConfigError: an unknown dtype, edge-value files, a directed reading, an output inside
            the source or not a dataset fullgraph wrote.
        DataError: missing, malformed or inconsistent source files (one line naming the file).
        FileExistsError: the output exists and ``force`` is false.
        OutputError: the disk filled up (nothing is left).
    """
    if feature_dtype not in FEATURE_DTYPES:
        raise ConfigError(
            f"--feature-dtype {feature_dtype!r}: choose one of {', '.join(FEATURE_DTYPES)}"
        )
    d, n = source_nodes(root, name, symmetric)
    out_root = Path(root if out_root is None else out_root)
    out_name = default_name(name) if out_name is None else out_name
    target = dataset_dir(out_root, out_name)
    named = f"--out-root {out_root} --name {out_name}"
    check_apart([Place(target, named, whole=True)], dataset_inputs(name, root))
    marker = read_marker(d)
    raw = d / "raw"
    n_path = raw / "num-node-list.csv.gz"
    m = _read_count(_require(raw / "num-edge-list.csv.gz"), 0)
    says = f"{n_path.name} says {n} nodes"
    feat = raw / "node-feat.csv.gz"
    has_features = feat.is_file() or marker.get("has_features", True)
    log.info("%s: ingesting %d nodes, %d edge lines into %s", name, n, m, target)
    with atomic_dir(target, force=force, ours=DATASET) as tmp:
        arrays, scratch = tmp / ARRAYS_DIR, tmp / "scratch"
        arrays.mkdir()
        scratch.mkdir()
        y, top = _read_labels(_require(raw / "node-label.csv.gz"), n, n_path.name)
        num_classes = int(marker.get("num_classes", top + 1))
        if top >= num_classes:
            raise DataError(
                f"{d / 'meta.json'}: num_classes is {num_classes} but "
                f"{raw / 'node-label.csv.gz'} holds label {top}; one of the two files is wrong"
            )
        masks = read_split_masks(d, marker, n, says)
        log.info("%s: labels and split read", name)
        np.save(arrays / "y.npy", y)
        del y
        for key, mask in masks.items():
            np.save(arrays / f"{key}.npy", mask)
        del masks
        nnz = _write_edges(_require(raw / "edge.csv.gz"), n, m, says, scratch, arrays)
        log.info("%s: CSR of %d entries written", name, nnz)
        shutil.rmtree(scratch)
        if has_features:
            width = _write_features(_require(feat), n, n_path.name, arrays, feature_dtype)
            log.info("%s: %d x %d features written as %s", name, n, width, feature_dtype)
        out_marker = {
            "format": MARKER_FORMAT,
            "layout": LAYOUT,
            "name": out_name,
            "num_classes": num_classes,
            "split_scheme": _split_dir(d, marker).name,
            "edges_symmetric_once": True,
            "has_features": bool(has_features),
            "feature_dtype": feature_dtype,
            "ingested_from": {"path": os.path.abspath(d), "name": name},
        }
        if "source" in marker:
            out_marker["source"] = marker["source"]
        atomic_write_json(tmp / "meta.json", out_marker)
    return target
