"""The on-disk partition format: names, dtypes, checksums and the metadata file.

A partition directory ``OUT/`` written by :func:`fullgraph.partition.write_partitions` holds::

    OUT/meta.json
    OUT/part-0/global_ids.npy   ...   OUT/part-<P-1>/...

``meta.json`` (JSON object) has ``format_version``, ``dataset``, ``num_nodes``, ``num_edges``,
``num_features``, ``num_classes``, ``num_parts``, ``method``, ``seed``, ``num_train_global``,
``edge_cut`` (directed edges ``u -> v`` whose endpoints have different owners), ``parts`` (per
part: ``rank``, ``num_inner``, ``num_halo``, ``num_edges``, ``num_train``), ``report`` (stage
times and peak memory, halo rows per part, rows exchanged per layer, imbalance of nodes / train
nodes / edges) and ``files``: for every ``part-<r>/<name>.npy`` its ``sha256``, ``bytes``,
``shape`` and ``dtype``.

Each ``part-<r>/`` holds one ``.npy`` file per array of :data:`PART_ARRAYS` (all loadable with
``np.load(..., mmap_mode="r")``). Local ids put the ``num_inner`` nodes this rank owns first
(ascending global id), then its ``num_halo`` halo nodes (sources of incoming edges owned by other
ranks) grouped by owner rank ascending, ascending global id within an owner.

============== ====== ======================== ==================================================
name           dtype  shape                    meaning
============== ====== ======================== ==================================================
global_ids     int64  [num_inner + num_halo]   original node id of every local node
indptr         int64  [num_inner + 1]          CSR row pointers; row = inner node
indices        int64  [nnz]                    local id of the source of every incoming edge
in_degree      int64  [num_inner + num_halo]   global in-degree of every local node
x              float32 [num_inner, F]          features of inner nodes (F = 0 when none)
y              int64  [num_inner]              labels of inner nodes (-1 = unlabelled)
train_mask     bool   [num_inner]              split masks of inner nodes
val_mask       bool   [num_inner]
test_mask      bool   [num_inner]
send_index     int64  [sum of sends]           local inner ids sent to peer q are
                                               ``send_index[send_offsets[q]:send_offsets[q+1]]``
                                               in the order q stores them as halo
send_offsets   int64  [P + 1]
recv_offsets   int64  [P + 1]                  halo rows from owner q are local ids
                                               ``num_inner + recv_offsets[q]`` up to
                                               ``num_inner + recv_offsets[q+1] - 1``
============== ====== ======================== ==================================================
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fullgraph.errors import PartitionError

#: Version of the layout described above; bumped on any incompatible change.
FORMAT_VERSION = 1

#: Name of the metadata file at the top of a partition directory.
META_NAME = "meta.json"

#: Keys every ``meta.json`` must have.
REQUIRED_META_KEYS = (
    "dataset",
    "num_nodes",
    "num_edges",
    "num_features",
    "num_classes",
    "num_parts",
    "method",
    "seed",
    "num_train_global",
    "edge_cut",
    "parts",
    "report",
    "files",
)

#: Every array of a part and its dtype, in the order they are written.
PART_ARRAYS: dict[str, np.dtype] = {
    "global_ids": np.dtype(np.int64),
    "indptr": np.dtype(np.int64),
    "indices": np.dtype(np.int64),
    "in_degree": np.dtype(np.int64),
    "x": np.dtype(np.float32),
    "y": np.dtype(np.int64),
    "train_mask": np.dtype(np.bool_),
    "val_mask": np.dtype(np.bool_),
    "test_mask": np.dtype(np.bool_),
    "send_index": np.dtype(np.int64),
    "send_offsets": np.dtype(np.int64),
    "recv_offsets": np.dtype(np.int64),
}


def part_dir_name(rank: int) -> str:
    """Directory name of part ``rank`` inside a partition directory (``part-<rank>``)."""
    return f"part-{rank}"


def file_key(rank: int, name: str) -> str:
    """Key of an array file in ``meta["files"]``, its path relative to the partition root."""
    return f"{part_dir_name(rank)}/{name}.npy"


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of the file at ``path``, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_meta(path: str | Path) -> tuple[dict, str]:
    """Read ``meta.json`` of the partition directory ``path``.

    Args:
        path: the partition directory.

    Returns:
        ``(meta, sha256 of the meta.json bytes)``.

    Raises:
        PartitionError: the file is missing, unreadable, not JSON or of another format version.
    """
    meta_path = Path(path) / META_NAME
    if not Path(path).is_dir():
        raise PartitionError(f"partition directory {path} does not exist")
    try:
        raw = meta_path.read_bytes()
    except OSError as exc:
        raise PartitionError(f"cannot read {meta_path}: {exc.strerror}") from exc
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PartitionError(
            f"{meta_path} is not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from exc
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise PartitionError(
            f"{meta_path} has format_version {version!r}, this fullgraph reads {FORMAT_VERSION}"
        )
    missing = [k for k in REQUIRED_META_KEYS if k not in meta]
    if missing:
        raise PartitionError(f"{meta_path} lacks {', '.join(missing)}")
    if len(meta["parts"]) != meta["num_parts"]:
        raise PartitionError(
            f"{meta_path} describes {len(meta['parts'])} parts but num_parts is {meta['num_parts']}"
        )
    return meta, hashlib.sha256(raw).hexdigest()


def check_file(root: Path, key: str, entry: dict, verify_checksum: bool) -> Path:
    """Check one array file against its ``meta["files"]`` entry.

    Args:
        root: the partition directory.
        key: the file's path relative to ``root``.
        entry: its recorded ``bytes`` and ``sha256``.
        verify_checksum: also hash the file (size is always checked).

    Returns:
        The file's path.

    Raises:
        PartitionError: the file is missing, has another size (truncated) or another checksum.
    """
    path = root / key
    if not path.is_file():
        raise PartitionError(f"{path} is missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise PartitionError(
            f"{path} has {size} bytes, meta.json records {entry['bytes']} (truncated or replaced)"
        )
    if verify_checksum and sha256_file(path) != entry["sha256"]:
        raise PartitionError(f"{path} fails its sha256 checksum (corrupted or modified)")
    return path
