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
``shape`` and ``dtype``; a dataset with fixed splits to choose from adds ``split`` (which one the
masks hold).

Each ``part-<r>/`` holds one ``.npy`` file per array of :data:`PART_ARRAYS` (all loadable with
``np.load(..., mmap_mode="r")``). Local ids put the ``num_inner`` nodes this rank owns first
(ascending global id; in a partition with blocks, see below, ordered by block and ascending
global id within a block), then its ``num_halo`` halo nodes (sources of incoming edges owned by
other ranks) grouped by owner rank ascending, ascending global id within an owner.

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

Edge values (:data:`EDGE_ARRAYS`), only when the graph has them: ``meta.json`` then records
``edge_weight: true`` and / or ``edge_dim: F_e > 0`` (a partition without these keys has none,
and loads as before). Every edge is stored once, by the part that owns its TARGET, in the order
of that part's ``indices``: entry ``e`` of ``edge_weight`` / row ``e`` of ``edge_attr`` belongs
to the edge ``indices[e] -> row of e``, so a layer reads them aligned with its CSR and no halo
exchange is needed for them.

============== ======= ======================= =================================================
name           dtype   shape                   meaning
============== ======= ======================= =================================================
edge_weight    float32 [nnz]                   weight of every stored (incoming) edge
in_weight      float64 [num_inner + num_halo]  GLOBAL weighted in-degree (sum of the weights of
                                               the node's incoming edges in the whole graph) of
                                               every local node: weighted GCN's source degrees
                                               without a set-up exchange
edge_attr      float32 [nnz, F_e]              feature row of every stored (incoming) edge
============== ======= ======================= =================================================

Blocks (:data:`BLOCK_ARRAYS`, the partition bit-identical training needs, written by the default
``--assign blocks``; see :mod:`fullgraph.partition.blocks`): ``meta.json`` then records
``num_blocks`` (blocks of the whole graph, the same for every P), ``block_size`` (the target
size they were cut with), ``block_seed``, ``block_metis`` (the METIS library that cut them) and
``block_sha256`` (SHA-256 of the int64 block of every node, in global id order), and every
``parts[r]`` its ``num_blocks``. Every part is a contiguous run of whole blocks; its inner rows
are block-contiguous. A partition without these keys has no blocks and loads as before.

============== ====== ======================== ==================================================
name           dtype  shape                    meaning
============== ====== ======================== ==================================================
block_ids      int64  [b]                      the blocks this part holds, ascending
block_ptr      int64  [b + 1]                  block ``block_ids[k]`` is the inner rows
                                               ``block_ptr[k]`` up to ``block_ptr[k+1] - 1``
============== ====== ======================== ==================================================

A receptive-field cut (:data:`CUT_ARRAYS`, only when ``meta.json`` has ``cut``; see
:mod:`fullgraph.partition.receptive_cut`): ``node_ids`` int64 [num_inner + num_halo], every
local node's id in the whole graph (``global_ids`` are the cut's, in the same order); with
blocks also ``block_pos`` int64 [num_inner], each inner row's position in its block of the whole
graph, and ``block_full`` int64 [b], each of the part's blocks' size there.

Link prediction (:data:`LINK_ARRAYS`, only when ``meta.json`` has ``link``): every part holds
the supervision edges anchored at its inner nodes, ``link_<split>[_id|_neg|_neg_id]``; see
:mod:`fullgraph.partition.link_parts`. A partition without ``link`` loads as before.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fullgraph.errors import ConfigError, PartitionError

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


#: The optional per-edge arrays of a part (see above) and their dtypes.
EDGE_ARRAYS: dict[str, np.dtype] = {
    "edge_weight": np.dtype(np.float32),
    "in_weight": np.dtype(np.float64),
    "edge_attr": np.dtype(np.float32),
}


#: The per-part block arrays of a partition with blocks (see above) and their dtypes.
BLOCK_ARRAYS: dict[str, np.dtype] = {
    "block_ids": np.dtype(np.int64),
    "block_ptr": np.dtype(np.int64),
}

#: The per-part supervision edges of a link-prediction partition (``meta.json["link"]``; the
#: table is in :mod:`fullgraph.partition.link_parts`): all int64.
LINK_ARRAYS: dict[str, np.dtype] = {
    f"link_{s}{suffix}": np.dtype(np.int64)
    for s in ("train", "valid", "test")
    for suffix in ("", "_id", "_neg", "_neg_id")
    if s != "train" or suffix in ("", "_id")
}

#: The per-part arrays of a receptive-field cut (see above) and their dtypes.
CUT_ARRAYS: dict[str, np.dtype] = {
    "node_ids": np.dtype(np.int64),
    "block_pos": np.dtype(np.int64),
    "block_full": np.dtype(np.int64),
}

#: The ``meta.json`` keys of a partition with blocks.
BLOCK_META_KEYS = ("num_blocks", "block_size", "block_seed", "block_metis", "block_sha256")


def block_arrays(meta: dict) -> tuple[str, ...]:
    """The block arrays a partition with this ``meta.json`` stores (none without blocks)."""
    return tuple(BLOCK_ARRAYS) if "num_blocks" in meta else ()


def cut_arrays(meta: dict) -> tuple[str, ...]:
    """The cut arrays a partition with this ``meta.json`` stores (none without ``cut``)."""
    if "cut" not in meta:
        return ()
    return ("node_ids", "block_pos", "block_full") if "num_blocks" in meta else ("node_ids",)


def edge_arrays(meta: dict) -> tuple[str, ...]:
    """The optional per-edge arrays a partition with this ``meta.json`` stores."""
    names = ("edge_weight", "in_weight") if meta.get("edge_weight", False) else ()
    return names + (("edge_attr",) if meta.get("edge_dim", 0) else ())


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


_GIVE = f"give the directory written by `fullgraph partition` (or its {META_NAME})"


def partition_root(path: str | Path) -> Path:
    """The partition directory meant by ``path``: the directory itself or its ``meta.json``.

    Args:
        path: a partition directory, or the ``meta.json`` inside one.

    Returns:
        The directory.

    Raises:
        PartitionError: ``path`` does not exist or is another file; the message says what to
            give instead.
    """
    p = Path(path)
    if p.is_dir():
        return p
    if p.is_file():
        if p.name == META_NAME:
            return p.parent
        raise PartitionError(f"{p} is a file, not a partition directory; {_GIVE}")
    raise PartitionError(f"partition directory {p} does not exist; {_GIVE}")


#: What to do about a partition whose files disagree with each other.
REWRITE = "write the partition again (--force)"


def _integer(meta_path: Path, field: str, value: object, least: int | None = 0) -> int:
    """``value`` checked to be a JSON integer (not a bool, not a float) ``>= least``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PartitionError(f"{meta_path}: {field} must be an integer, got {value!r}")
    if least is not None and value < least:
        raise PartitionError(f"{meta_path}: {field} is {value}, must be at least {least}")
    return value


def _check_meta(meta: dict, meta_path: Path) -> None:
    """Types, ranges and sums of every field of ``meta.json`` that can be checked without arrays.

    Raises:
        PartitionError: naming the file and the field.
    """
    for key in ("dataset", "method"):
        if not isinstance(meta[key], str):
            raise PartitionError(f"{meta_path}: {key} must be a string, got {meta[key]!r}")
    n = _integer(meta_path, "num_nodes", meta["num_nodes"], 1)
    m = _integer(meta_path, "num_edges", meta["num_edges"])
    _integer(meta_path, "num_features", meta["num_features"])
    _integer(meta_path, "edge_dim", meta.get("edge_dim", 0))
    if not isinstance(meta.get("edge_weight", False), bool):
        raise PartitionError(f"{meta_path}: edge_weight must be true or false")
    _integer(meta_path, "num_classes", meta["num_classes"])
    P = _integer(meta_path, "num_parts", meta["num_parts"], 1)
    _integer(meta_path, "seed", meta["seed"], None)
    train = _integer(meta_path, "num_train_global", meta["num_train_global"])
    cut = _integer(meta_path, "edge_cut", meta["edge_cut"])
    if P > n:
        raise PartitionError(f"{meta_path}: num_parts {P} exceeds num_nodes {n}; {REWRITE}")
    if cut > m:
        raise PartitionError(f"{meta_path}: edge_cut {cut} exceeds num_edges {m}; {REWRITE}")
    if not isinstance(meta["report"], dict):
        raise PartitionError(f"{meta_path}: report must be a JSON object")
    parts = meta["parts"]
    if not isinstance(parts, list) or not all(isinstance(q, dict) for q in parts):
        raise PartitionError(f"{meta_path}: parts must be a list of objects, one per part")
    if len(parts) != P:
        raise PartitionError(
            f"{meta_path} describes {len(parts)} parts but num_parts is {P}; {REWRITE}"
        )
    _check_block_meta(meta, meta_path)
    totals = {"num_inner": 0, "num_edges": 0, "num_train": 0}
    for r, part in enumerate(parts):
        missing = [
            k for k in ("rank", "num_inner", "num_halo", "num_edges", "num_train") if k not in part
        ]
        if missing:
            raise PartitionError(f"{meta_path}: parts[{r}] lacks {', '.join(missing)}")
        if _integer(meta_path, f"parts[{r}].rank", part["rank"]) != r:
            raise PartitionError(
                f"{meta_path}: parts[{r}].rank is {part['rank']}, expected {r}; {REWRITE}"
            )
        for key in ("num_inner", "num_halo", "num_edges", "num_train", "num_send"):
            if key in part:
                _integer(meta_path, f"parts[{r}].{key}", part[key])
        if part["num_train"] > part["num_inner"]:
            raise PartitionError(
                f"{meta_path}: parts[{r}].num_train {part['num_train']} exceeds its num_inner "
                f"{part['num_inner']}; {REWRITE}"
            )
        if part["num_halo"] > n - part["num_inner"]:
            raise PartitionError(
                f"{meta_path}: parts[{r}].num_halo {part['num_halo']} exceeds the "
                f"{n - part['num_inner']} nodes other parts own; {REWRITE}"
            )
        for key in totals:
            totals[key] += part[key]
    for key, total_key, total in (
        ("num_inner", "num_nodes", n),
        ("num_edges", "num_edges", m),
        ("num_train", "num_train_global", train),
    ):
        if totals[key] != total:
            raise PartitionError(
                f"{meta_path}: {total_key} is {total} but the parts' {key} add up to "
                f"{totals[key]}; {REWRITE}"
            )
    files = meta["files"]
    if not isinstance(files, dict):
        raise PartitionError(f"{meta_path}: files must be a JSON object")
    for key, entry in files.items():
        where = f"files[{key!r}]"
        if not isinstance(entry, dict) or not {"sha256", "bytes", "shape", "dtype"} <= set(entry):
            raise PartitionError(f"{meta_path}: {where} needs sha256, bytes, shape and dtype")
        _integer(meta_path, f"{where}.bytes", entry["bytes"])
        if not isinstance(entry["sha256"], str) or not isinstance(entry["dtype"], str):
            raise PartitionError(f"{meta_path}: {where}.sha256 and .dtype must be strings")
        if not isinstance(entry["shape"], list):
            raise PartitionError(f"{meta_path}: {where}.shape must be a list of sizes")
        for i, size in enumerate(entry["shape"]):
            _integer(meta_path, f"{where}.shape[{i}]", size)


def _check_block_meta(meta: dict, meta_path: Path) -> None:
    """The block fields of ``meta.json``, when it has any: all or none, in range, and the
    parts' ``num_blocks`` adding up to ``num_blocks``.

    Raises:
        PartitionError: naming the file and the field.
    """
    present = [k for k in BLOCK_META_KEYS if k in meta]
    if not present:
        return
    if len(present) != len(BLOCK_META_KEYS):
        missing = [k for k in BLOCK_META_KEYS if k not in meta]
        raise PartitionError(f"{meta_path} has blocks but lacks {', '.join(missing)}; {REWRITE}")
    n = meta["num_nodes"]
    nb = _integer(meta_path, "num_blocks", meta["num_blocks"], 1)
    _integer(meta_path, "block_size", meta["block_size"], 1)
    _integer(meta_path, "block_seed", meta["block_seed"], None)
    for key in ("block_metis", "block_sha256"):
        if not isinstance(meta[key], str):
            raise PartitionError(f"{meta_path}: {key} must be a string, got {meta[key]!r}")
    if nb > n:
        raise PartitionError(f"{meta_path}: num_blocks {nb} exceeds num_nodes {n}; {REWRITE}")
    total = 0
    for r, part in enumerate(meta["parts"]):
        total += _integer(meta_path, f"parts[{r}].num_blocks", part.get("num_blocks"))
    if total != nb:
        raise PartitionError(
            f"{meta_path}: num_blocks is {nb} but the parts' num_blocks add up to {total}; "
            f"{REWRITE}"
        )


def read_meta(path: str | Path) -> tuple[dict, str]:
    """Read and check ``meta.json`` of the partition directory ``path``.

    Every field is checked for its type and range, and the per-part counts against the totals
    (``num_inner`` adds up to ``num_nodes``, ``num_edges`` to ``num_edges``, ``num_train`` to
    ``num_train_global``; ``rank`` is the part's index). The arrays are checked against these
    counts by :func:`fullgraph.partition.load_partition`.

    Args:
        path: the partition directory, or its ``meta.json``.

    Returns:
        ``(meta, sha256 of the meta.json bytes)``.

    Raises:
        PartitionError: the directory or file is missing or unreadable, not JSON, of another
            format version, or a field is missing, of the wrong type or inconsistent (the
            message names the file and the field).
    """
    root = partition_root(path)
    meta_path = root / META_NAME
    try:
        raw = meta_path.read_bytes()
    except FileNotFoundError as exc:
        raise PartitionError(
            f"{root} holds no {META_NAME}: not a partition directory (or an unfinished one); "
            f"{_GIVE}"
        ) from exc
    except OSError as exc:
        raise PartitionError(f"cannot read {meta_path}: {exc.strerror}") from exc
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PartitionError(
            f"{meta_path} is not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from exc
    except UnicodeDecodeError as exc:
        raise PartitionError(f"{meta_path} is not valid JSON (not UTF-8 text)") from exc
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise PartitionError(
            f"{meta_path} has format_version {version!r}, this fullgraph reads {FORMAT_VERSION}"
        )
    missing = [k for k in REQUIRED_META_KEYS if k not in meta]
    if missing:
        raise PartitionError(f"{meta_path} lacks {', '.join(missing)}")
    _check_meta(meta, meta_path)
    return meta, hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class PartitionDir:
    """A partition directory whose ``meta.json`` was read and checked once.

    Every reader of a process starts from one (:meth:`open`): the rank-count check, the memory
    plan's sizes and :func:`fullgraph.partition.load_partition` share it instead of reading
    ``meta.json`` again.

    Attributes:
        root: the directory.
        meta: the checked ``meta.json``.
        meta_hash: sha256 of the ``meta.json`` bytes (the partition's identity).
    """

    root: Path
    meta: dict = field(repr=False)
    meta_hash: str

    @classmethod
    def open(cls, path: str | Path) -> PartitionDir:
        """Read and check ``meta.json`` of ``path`` (the directory or its ``meta.json``).

        Raises:
            PartitionError: see :func:`read_meta`.
        """
        root = partition_root(path)
        meta, meta_hash = read_meta(root)
        return cls(root, meta, meta_hash)

    @property
    def num_parts(self) -> int:
        """How many parts (ranks) the partition has."""
        return int(self.meta["num_parts"])

    def check_ranks(self, size: int, advice: str) -> None:
        """Refuse a job whose rank count is not the part count.

        Args:
            size: ranks started.
            advice: what to do instead (``run `mpirun -n 4```).

        Raises:
            ConfigError: one line naming both counts and the advice.
        """
        if self.num_parts != size:
            raise ConfigError(
                f"{self.root} has {self.num_parts} parts but {size} ranks were started; {advice}"
            )


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
    if verify_checksum:
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise PartitionError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if digest != entry["sha256"]:
            raise PartitionError(f"{path} fails its sha256 checksum (corrupted or modified)")
    return path
