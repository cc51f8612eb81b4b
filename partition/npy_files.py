"""Writing a part's arrays as ``.npy`` files, hashed while written, whole or block by block."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fullgraph.errors import PartitionError
from fullgraph.partition.format import (
    BLOCK_ARRAYS,
    CUT_ARRAYS,
    EDGE_ARRAYS,
    LINK_ARRAYS,
    PART_ARRAYS,
    file_key,
)


@dataclass
class ChunkedArray:
    """An array written piece by piece: ``chunks()`` yields consecutive row blocks.

    Lets a part's large arrays (its edges, its feature rows) go to disk without ever being
    held whole.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: Callable[[], Iterator[np.ndarray]]


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array of ``shape`` and ``dtype``."""
    buf = io.BytesIO()
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": tuple(int(s) for s in shape),
    }
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def save_array(
    root: Path, rank: int, name: str, array: np.ndarray | ChunkedArray, files: dict
) -> None:
    """Save ``array`` as ``part-<rank>/<name>.npy`` under ``root`` and record it in ``files``.

    The file holds the bytes ``np.save`` would write; its SHA-256 is computed while writing.
    A :class:`ChunkedArray` is written block by block.
    """
    expected = (
        PART_ARRAYS.get(name)
        or EDGE_ARRAYS.get(name)
        or LINK_ARRAYS.get(name)
        or CUT_ARRAYS.get(name)
        or BLOCK_ARRAYS[name]
    )
    if array.dtype != expected:
        raise PartitionError(f"internal: {name} has dtype {array.dtype}, expected {expected}")
    key = file_key(rank, name)
    path = root / key
    shape = tuple(int(s) for s in array.shape)
    blocks = array.chunks() if isinstance(array, ChunkedArray) else iter([array])
    header = npy_header(shape, expected)
    digest = hashlib.sha256(header)
    size, rows = len(header), 0
    with open(path, "wb") as f:
        f.write(header)
        for block in blocks:
            data = np.ascontiguousarray(block, dtype=expected).reshape(-1).view(np.uint8)
            f.write(data)
            digest.update(data)
            size += data.nbytes
            rows += block.shape[0]
    if shape and rows != shape[0]:
        raise PartitionError(f"internal: {name} got {rows} rows, expected {shape[0]}")
    files[key] = {
        "sha256": digest.hexdigest(),
        "bytes": size,
        "shape": list(shape),
        "dtype": str(expected),
    }
