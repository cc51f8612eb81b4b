"""Loading one rank's part of a partition directory."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fullgraph.errors import PartitionError
from fullgraph.partition.format import META_NAME, PART_ARRAYS, check_file, file_key, read_meta


@dataclass
class Partition:
    """The part of the graph one rank owns, with its halo and exchange maps.

    Local ids: ``0 .. num_inner-1`` are the inner (owned) nodes, ``num_inner ..
    num_inner+num_halo-1`` the halo nodes, grouped by owner rank ascending.

    Shapes:
        - ``global_ids``, ``in_degree``: int64 [num_inner + num_halo]
        - ``indptr``: int64 [num_inner + 1]; ``indices``: int64 [nnz] (local source ids of the
          incoming edges of every inner node)
        - ``x``: float32 [num_inner, num_features]; ``y``: int64 [num_inner]
        - ``train_mask``, ``val_mask``, ``test_mask``: bool [num_inner]
        - ``send_index``: int64 [total rows sent]; ``send_offsets``, ``recv_offsets``: int64 [P+1]
    """

    rank: int
    num_parts: int
    num_inner: int
    num_halo: int
    global_ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    in_degree: np.ndarray
    x: np.ndarray
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    send_index: np.ndarray
    send_offsets: np.ndarray
    recv_offsets: np.ndarray
    num_classes: int
    num_features: int
    num_train_global: int
    partition_hash: str
    meta: dict = field(repr=False)

    def __repr__(self) -> str:
        return (
            f"Partition(rank={self.rank}, num_parts={self.num_parts}, num_inner={self.num_inner}, "
            f"num_halo={self.num_halo}, num_edges={self.num_edges}, "
            f"num_features={self.num_features}, num_classes={self.num_classes})"
        )

    @property
    def num_local(self) -> int:
        """Inner plus halo nodes."""
        return self.num_inner + self.num_halo

    @property
    def num_edges(self) -> int:
        """Incoming edges of the inner nodes stored in this part."""
        return int(self.indices.shape[0])

    def send_to(self, peer: int) -> np.ndarray:
        """Local inner ids this rank sends to ``peer``, in the order ``peer`` stores them."""
        return self.send_index[self.send_offsets[peer] : self.send_offsets[peer + 1]]

    def halo_from(self, peer: int) -> slice:
        """Local ids of the halo rows owned by ``peer``, as a slice."""
        start = self.num_inner + int(self.recv_offsets[peer])
        return slice(start, self.num_inner + int(self.recv_offsets[peer + 1]))


def load_partition(
    path: str | os.PathLike[str], rank: int, *, mmap: bool = True, verify_checksums: bool = True
) -> Partition:
    """Load part ``rank`` of the partition directory ``path``.

    Args:
        path: a directory written by :func:`fullgraph.partition.write_partitions`.
        rank: which part, ``0 <= rank < num_parts``.
        mmap: memory-map the arrays (read-only) instead of reading them into memory.
        verify_checksums: hash every file of the part against ``meta.json`` first (sizes are
            always checked).

    Returns:
        The :class:`Partition`.

    Raises:
        PartitionError: missing directory or file, corrupted or truncated file, rank out of
            range, or arrays that disagree with ``meta.json``.
    """
    root = Path(path)
    meta, meta_hash = read_meta(root)
    num_parts = int(meta["num_parts"])
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise PartitionError(f"rank must be an integer, got {rank!r}")
    if not 0 <= rank < num_parts:
        raise PartitionError(f"rank {rank} out of range: {root} has {num_parts} parts")
    arrays: dict[str, np.ndarray] = {}
    for name, dtype in PART_ARRAYS.items():
        key = file_key(rank, name)
        entry = meta["files"].get(key)
        if entry is None:
            raise PartitionError(f"{root / META_NAME} lists no file {key}")
        file = check_file(root, key, entry, verify_checksums)
        try:
            array = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise PartitionError(f"{file} is not a readable .npy file ({exc})") from exc
        if array.dtype != dtype or list(array.shape) != entry["shape"]:
            raise PartitionError(
                f"{file} holds {array.dtype} {list(array.shape)}, meta.json records "
                f"{entry['dtype']} {entry['shape']}"
            )
        arrays[name] = array
    part = meta["parts"][rank]
    num_inner, num_halo = int(part["num_inner"]), int(part["num_halo"])
    if arrays["global_ids"].shape[0] != num_inner + num_halo:
        raise PartitionError(
            f"{root / file_key(rank, 'global_ids')} has {arrays['global_ids'].shape[0]} rows, "
            f"expected num_inner + num_halo = {num_inner + num_halo}"
        )
    return Partition(
        rank=int(rank),
        num_parts=num_parts,
        num_inner=num_inner,
        num_halo=num_halo,
        num_classes=int(meta["num_classes"]),
        num_features=int(meta["num_features"]),
        num_train_global=int(meta["num_train_global"]),
        partition_hash=meta_hash,
        meta=meta,
        **arrays,
    )
