"""Out-of-core writer of the synthetic graphs: generated and written in chunks.

:func:`write_synthetic` draws exactly the graph :func:`fullgraph.datasets.synthetic.generate`
draws (the same streams in the same order: equal arrays, ``tests/datasets/
test_synthetic_chunked.py``) and writes it in the ``npy`` layout
(:mod:`fullgraph.datasets.npy_layout`), without ever holding the edges or the features:

- **edges**: every chunk of drawn keys ``min * N + max`` is appended to the bucket file of its
  key range (buckets of about :data:`BUCKET_KEYS` keys, ranges from the triangular law of
  ``min``); after a round of draws each bucket is read, sorted and made distinct alone, so the
  concatenation of the buckets is the in-memory path's sorted distinct keys; the surplus is
  dropped while streaming them into one key file.
- **CSR**: degrees counted over the key file; the keys transposed (``hi * N + lo``, bucketed
  by ``hi`` with bounds made exact from the count of keys per ``hi``
  (:func:`bounds_from_counts`), sorted bucket by bucket like the draws); then the rows in
  ranges of at most
  :data:`ROW_BUFFER` entries, each filled in memory from one contiguous run of each file (a
  row's sources below it, then above it, both ascending) and written once, in order, to
  ``indices.npy``: every file is read sequentially, a bounded number of times.
- **features**: drawn a block of rows at a time and written to the memory-mapped ``x.npy``
  (float32, or float16 to halve the file; the reader widens).

Written pages of the maps are flushed and unmapped from this process every
:data:`RELEASE_BYTES` (they stay in the page cache), so the resident set stays near the bound
below. Memory: the per-node state of the generator (labels, communities, the ring sampler's
cumulative weights and positions, the split, degrees and row cursors: about
:data:`NODE_STATE_BYTES` bytes per node) plus a few chunk-sized buffers (about
:data:`CHUNK_STATE_BYTES`), whatever the edge count and the feature width. The scratch files
lie inside the temporary directory that becomes the dataset, so an interrupted run
(Ctrl-C, SIGTERM through the CLI, a full disk) leaves no dataset, half-written or not.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fullgraph.atomic import atomic_dir, atomic_write_json
from fullgraph.datasets.npy_layout import FEATURE_DTYPES, LAYOUT
from fullgraph.datasets.ogb_writer import ARRAYS_DIR, DATASET, MARKER_FORMAT
from fullgraph.datasets.paths import dataset_dir
from fullgraph.datasets.synthetic import (
    SynthConfig,
    communities,
    edge_sampler,
    feature_blocks,
    labelled_nodes,
    resolve,
    split_masks,
    streams,
)
from fullgraph.datasets.synthetic_edges import CHUNK, draw_edges, sorted_distinct
from fullgraph.errors import ConfigError
from fullgraph.resources import drop_resident_pages

__all__ = ["BUCKET_KEYS", "KeysOnDisk", "bounds_from_counts", "write_synthetic"]

log = logging.getLogger(__name__)

#: Keys a bucket is sized for (int64: 128 MiB), read and sorted alone.
BUCKET_KEYS = 1 << 24
#: Bytes written into a map between flushes that unmap them from this process.
RELEASE_BYTES = 64 << 20
#: CSR entries (int64) filled in memory at a time: a range of rows, written once.
ROW_BUFFER = 1 << 25
#: Bytes per node the generator keeps in memory (measured bound, docs/datasets.md).
NODE_STATE_BYTES = 160
#: Bytes of chunk-sized buffers besides (a bucket being sorted, a chunk being scattered).
CHUNK_STATE_BYTES = 768 << 20


def _bar(total: int, desc: str, unit: str) -> tqdm:
    """A progress bar per chunk, on a terminal only and only for large graphs."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=True,
        leave=False,
        disable=None if total >= 5 * CHUNK else True,  # None: only on a terminal
    )


def _release(array: np.memmap) -> None:
    """Flush a writable map and unmap its pages from this process (kept in the page cache)."""
    array.flush()
    mm = getattr(array, "_mmap", None)
    if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def bounds_from_counts(counts: np.ndarray, num_nodes: int) -> np.ndarray:
    """Exact bucket bounds (keys ``id * N + other``) from the number of keys of every id.

    Greedy over the ids in order: a bucket takes ids while it holds at most
    :data:`BUCKET_KEYS` keys; an id with more keys than that is a bucket of its own (read by
    :func:`_sorted_bucket` through a presence array of ``N`` bytes). So a bucket holds at most
    :data:`BUCKET_KEYS` keys or the keys of one id, whatever the order of the ids.

    Args:
        counts: int64 [N], keys per id (the ``min`` of a drawn key, or the ``hi``).
        num_nodes: ``N``.

    Returns:
        int64 sorted bounds for :func:`_append_by_range` (multiples of ``N``).
    """
    cum = np.cumsum(counts)
    cuts = []
    start, before = 0, 0
    while start < num_nodes:
        end = int(np.searchsorted(cum, before + BUCKET_KEYS, side="right"))
        end = min(num_nodes, max(end, start + 1))
        if end < num_nodes:
            cuts.append(end)
        before = int(cum[end - 1])
        start = end
    del cum
    return np.asarray(cuts, dtype=np.int64) * np.int64(num_nodes)


def _sorted_bucket(path: Path, low: int, high: int, n: int) -> np.ndarray:
    """The sorted distinct keys of the bucket file of key range ``[low, high)``.

    A bucket of one id (``high - low == n``) may hold more than :data:`BUCKET_KEYS` keys (a
    hub, duplicates of a file): its keys are marked in an ``n``-byte presence array, a chunk
    at a time, instead of being read whole.
    """
    if high - low != n or os.path.getsize(path) <= 8 * BUCKET_KEYS:
        return sorted_distinct(np.fromfile(path, dtype=np.int64))
    present = np.zeros(n, dtype=np.bool_)
    size = os.path.getsize(path) // 8
    for chunk in _key_chunks(path, 0, size):
        present[chunk - low] = True
    return np.flatnonzero(present) + np.int64(low)


def _ranges(bounds: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The key range ``[low, high)`` of every bucket of ``bounds``."""
    edges = [0, *(int(b) for b in bounds), n * n]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _append_by_range(files: list[Path], bounds: np.ndarray, keys: np.ndarray) -> None:
    """Append each key to ``files[i]`` for the range ``bounds[i - 1] <= key < bounds[i]``."""
    which = np.searchsorted(bounds, keys, side="right")
    order = np.argsort(which, kind="stable")
    keys, which = keys[order], which[order]
    cuts = np.searchsorted(which, np.arange(len(files) + 1))
    for i, f in enumerate(files):
        if cuts[i + 1] > cuts[i]:
            with open(f, "ab") as out:
                keys[cuts[i] : cuts[i + 1]].tofile(out)


class KeysOnDisk:
    """The distinct keys drawn so far, in bucket files by key range (for :func:`draw_edges`).

    Args:
        scratch: a directory for the bucket files and the final key file.
        num_nodes: ``N``.
        expected: about how many keys will be drawn (sizes the buckets).
        bounds: exact bucket bounds (:func:`bounds_from_counts`); default: from the
            triangular law of ``min`` for random pairs (the synthetic draws).
    """

    def __init__(
        self, scratch: Path, num_nodes: int, expected: int, bounds: np.ndarray | None = None
    ) -> None:
        self.scratch = scratch
        self.n = num_nodes
        if bounds is None:
            buckets = max(1, math.ceil(1.25 * expected / BUCKET_KEYS))
            q = np.arange(1, buckets) / buckets  # P(min < a) = 1 - (1 - a / N)^2, random pairs
            lo = np.unique(np.floor(num_nodes * (1 - np.sqrt(1 - q))).astype(np.int64))
            bounds = lo * np.int64(num_nodes)
        self.bounds = bounds
        self.files = [scratch / f"bucket-{i}.bin" for i in range(self.bounds.shape[0] + 1)]
        for f in self.files:
            f.touch()
        self.counts = [0] * len(self.files)

    def add(self, keys: np.ndarray) -> None:
        """Append a chunk of keys to the files of their buckets."""
        _append_by_range(self.files, self.bounds, keys)

    def merge(self) -> int:
        """Sort each bucket and drop its duplicates; the number of distinct keys."""
        for i, (f, (low, high)) in enumerate(
            zip(self.files, _ranges(self.bounds, self.n), strict=True)
        ):
            keys = _sorted_bucket(f, low, high, self.n)
            tmp = f.with_suffix(".tmp")
            keys.tofile(tmp)
            os.replace(tmp, f)
            self.counts[i] = int(keys.shape[0])
        return sum(self.counts)

    def finish(self, drops: Iterator[np.ndarray]) -> tuple[Path, int]:
        """The distinct keys without the positions ``drops`` yields, in one file:
        ``(its path, the number of keys)``."""
        pending = [np.empty(0, dtype=np.int64)]
        path = self.scratch / "keys.bin"
        offset = kept = 0
        with open(path, "wb") as out:
            for f, count in zip(self.files, self.counts, strict=True):
                keys = np.fromfile(f, dtype=np.int64)
                end = offset + count
                while pending[-1].size == 0 or pending[-1][-1] < end:
                    nxt = next(drops, None)
                    if nxt is None:
                        break
                    pending.append(nxt)
                here = np.concatenate(pending)
                mine = here[here < end] - offset
                pending = [here[here >= end]]
                if mine.size:
                    keep = np.ones(count, dtype=np.bool_)
                    keep[mine] = False
                    keys = keys[keep]
                keys.tofile(out)
                kept += keys.shape[0]
                f.unlink()
                offset = end
        return path, kept


def _key_chunks(path: Path, start: int, stop: int) -> Iterator[np.ndarray]:
    """Keys ``start:stop`` of a key file, :data:`CHUNK` at a time (read, not mapped)."""
    with open(path, "rb") as f:
        f.seek(8 * start)
        for s in range(start, stop, CHUNK):
            yield np.fromfile(f, dtype=np.int64, count=min(CHUNK, stop - s))


def _keys_below(path: Path, key: int) -> int:
    """How many keys of the (sorted) key file are below ``key``."""
    if os.path.getsize(path) == 0:  # an edgeless graph: nothing to map
        return 0
    keys = np.memmap(path, dtype=np.int64, mode="r")
    try:
        return int(np.searchsorted(keys, key))
    finally:
        drop_resident_pages(keys)
        del keys


def _transpose(path: Path, count: int, n: int, scratch: Path, bounds: np.ndarray) -> Path:
    """The keys ``lo * n + hi`` of ``path`` as ``hi * n + lo``, sorted, in one file: bucket
    files by range of ``hi`` (``bounds``: exact, from the keys per ``hi``), each sorted
    alone."""
    files = [scratch / f"rev-{i}.bin" for i in range(bounds.shape[0] + 1)]
    for f in files:
        f.touch()
    for chunk in _key_chunks(path, 0, count):
        lo, hi = np.divmod(chunk, np.int64(n))
        _append_by_range(files, bounds, hi * np.int64(n) + lo)
    out = scratch / "rev.bin"
    with open(out, "wb") as sink:
        for f, (low, high) in zip(files, _ranges(bounds, n), strict=True):
            _sorted_bucket(f, low, high, n).tofile(sink)  # distinct already: sorted alone
            f.unlink()
    return out


def _write_csr(path: Path, count: int, n: int, arrays: Path, bar: tqdm) -> int:
    """``indptr.npy`` and ``indices.npy`` of the symmetric graph of the sorted key file.

    Row ``v`` holds the ``lo`` of the keys ``(lo, v)`` (ascending, all below ``v``), then the
    ``hi`` of the keys ``(v, hi)`` (ascending, above): contiguous runs of the transposed key
    file and of the key file. Rows go in ranges of at most :data:`ROW_BUFFER` entries, each
    filled in memory from its two runs and written once, in order.
    """
    degree = np.zeros(n, dtype=np.int64)
    above = np.zeros(n, dtype=np.int64)  # keys per hi: exact bounds of the transpose
    for chunk in _key_chunks(path, 0, count):
        for counts, ends in zip((degree, above), np.divmod(chunk, np.int64(n)), strict=True):
            ends.sort()  # counted sorted: no N-sized temporary
            first = np.flatnonzero(np.concatenate([[True], ends[1:] != ends[:-1]]))
            counts[ends[first]] += np.diff(np.append(first, ends.shape[0]))
    degree += above
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    del degree
    np.save(arrays / "indptr.npy", indptr)
    nnz = int(indptr[-1])
    bounds = bounds_from_counts(above, n)
    del above
    rev = _transpose(path, count, n, path.parent, bounds)
    indices = np.lib.format.open_memmap(arrays / "indices.npy", "w+", np.int64, (nnz,))
    r0 = 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + ROW_BUFFER, side="right")) - 1
        r1 = min(n, max(r1, r0 + 1))
        base = int(indptr[r0])
        buf = np.empty(int(indptr[r1]) - base, dtype=np.int64)
        cursor = indptr[r0:r1] - base
        lo_key, hi_key = r0 * n, r1 * n
        for run in (rev, path):  # sources below the row, then above: ascending
            start, stop = _keys_below(run, lo_key), _keys_below(run, hi_key)
            for chunk in _key_chunks(run, start, stop):
                rows, srcs = np.divmod(chunk, np.int64(n))  # sorted by (row, source)
                first = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
                sizes = np.diff(np.append(first, rows.shape[0]))
                rank = np.arange(rows.shape[0]) - np.repeat(first, sizes)
                buf[cursor[rows - r0] + rank] = srcs
                cursor[rows[first] - r0] += sizes
                del rows, srcs, first, sizes, rank
        indices[base : int(indptr[r1])] = buf
        _release(indices)
        bar.update(buf.shape[0])
        del buf, cursor
        r0 = r1
    del indices
    rev.unlink()
    return nnz


def _write_features(
    cfg: SynthConfig, rng: np.random.Generator, y: np.ndarray, arrays: Path, dtype: str
) -> None:
    x = np.lib.format.open_memmap(
        arrays / "x.npy", "w+", np.dtype(dtype), (cfg.num_nodes, cfg.num_features)
    )
    written = 0
    with _bar(cfg.num_nodes * cfg.num_features, "features", "value") as bar:
        for s, block in feature_blocks(rng, cfg, y):
            x[s : s + block.shape[0]] = block
            written += block.shape[0] * cfg.num_features * x.dtype.itemsize
            if written >= RELEASE_BYTES:
                _release(x)
                written = 0
            bar.update(block.size)
    _release(x)


def write_synthetic(
    preset: str,
    root: str | Path,
    name: str,
    *,
    seed: int = 0,
    scale: float = 1.0,
    feature_dtype: str = "float32",
    force: bool = False,
    **overrides: float,
) -> Path:
    """Generate ``preset`` chunk by chunk and write it in the ``npy`` layout, atomically.

    Args:
        preset: a node preset of :data:`fullgraph.datasets.synthetic.PRESETS`.
        root: dataset root; ``load(name, root)`` finds the graph afterwards.
        name: the dataset's name.
        seed: random seed (the same graph as ``generate(preset, seed, scale)``).
        scale: multiply the preset's nodes and edges by this.
        feature_dtype: ``float32`` or ``float16`` (rounded from the float32 draws) on disk.
        force: replace an existing dataset directory that ``data synth`` wrote.
        **overrides: fields of :class:`~fullgraph.datasets.synthetic.SynthConfig`.

    Returns:
        The dataset directory.

    Raises:
        ConfigError: unknown preset, parameter or dtype, impossible sizes, or an existing
            directory that is not a dataset ``data synth`` wrote.
        FileExistsError: the directory exists and ``force`` is false.
    """
    if feature_dtype not in FEATURE_DTYPES:
        raise ConfigError(
            f"--feature-dtype {feature_dtype!r}: choose one of {', '.join(FEATURE_DTYPES)}"
        )
    cfg = resolve(preset, overrides, scale)
    n = cfg.num_nodes
    target = dataset_dir(root, name)
    with atomic_dir(target, force=force, ours=DATASET) as tmp:
        arrays = tmp / ARRAYS_DIR
        scratch = tmp / "scratch"
        arrays.mkdir()
        scratch.mkdir()
        rng_struct, rng_label, rng_feat, rng_split = streams(seed)
        y, block, num_blocks = communities(rng_label, cfg)
        sampler = edge_sampler(rng_struct, cfg, block, num_blocks)
        store = KeysOnDisk(scratch, n, int(1.1 * cfg.num_edges) + n)
        with _bar(cfg.num_edges, "edges drawn", "edge") as bar:
            keys = draw_edges(
                rng_struct,
                n,
                cfg.num_edges,
                sampler,
                surplus=cfg.surplus,
                store=store,
                progress=bar.update,
            )
        del sampler
        path, count = keys
        with _bar(2 * count, "csr", "entry") as bar:
            _write_csr(path, count, n, arrays, bar)
        shutil.rmtree(scratch)
        _write_features(cfg, rng_feat, y, arrays, feature_dtype)
        labelled = labelled_nodes(cfg, seed, block)
        del block
        masks = split_masks(cfg, rng_split, labelled)
        if labelled is not None:
            known = np.zeros(n, dtype=np.bool_)
            known[labelled] = True
            y[~known] = -1
            del known, labelled
        np.save(arrays / "y.npy", y)
        for key, m in zip(("train_mask", "val_mask", "test_mask"), masks, strict=True):
            np.save(arrays / f"{key}.npy", m)
        source = {"generator": "dcsbm", "preset": preset, "seed": seed, "params": asdict(cfg)}
        atomic_write_json(
            tmp / "meta.json",
            {
                "format": MARKER_FORMAT,
                "layout": LAYOUT,
                "name": name,
                "num_classes": int(cfg.num_classes),
                "split_scheme": "random",
                "edges_symmetric_once": True,
                "has_features": True,
                "feature_dtype": feature_dtype,
                "source": source,
            },
        )
    return target
