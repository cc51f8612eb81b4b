"""The ``npy`` dataset layout: a graph's arrays as memory-mappable ``.npy`` files.

Written by the chunked synthetic writer (:mod:`fullgraph.datasets.synthetic_chunked`,
``fullgraph data synth --format npy``) for graphs whose CSV text would not fit anywhere useful
(papers100M-class: 128 features of 111M nodes is 57 GB as float32). Layout under
``<root>/<name with - as _>/``::

    meta.json        fullgraph's marker (as the OGB layout's) with "layout": "npy" and
                     "feature_dtype": "float32" | "float16"
    arrays/indptr.npy, indices.npy       the symmetric CSR (int64), rows sorted and distinct
    arrays/x.npy                         features, float32 or float16 [N, F]
    arrays/y.npy                         int64 [N], -1 for unlabelled nodes
    arrays/{train,val,test}_mask.npy     bool [N]

:func:`read_npy_dataset` memory-maps them (``mmap=True``: float16 features stay float16 on
disk and in the map; readers widen per block, as ``fullgraph partition`` does per part) or
reads them (``mmap=False``: float16 features widened to float32 block by block into one array).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fullgraph.atomic import read_marker
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_writer import ARRAYS_DIR, MARKER_FORMAT, NPY_ARRAYS
from fullgraph.errors import DataError
from fullgraph.resources import drop_resident_pages

__all__ = ["LAYOUT", "FEATURE_DTYPES", "is_npy_dataset", "read_npy_dataset"]

#: The marker's ``layout`` value of this layout.
LAYOUT = "npy"
#: Feature dtypes on disk.
FEATURE_DTYPES = ("float32", "float16")
#: Rows per block when widening float16 features.
_WIDEN_ROWS = 1 << 16


def is_npy_dataset(d: Path) -> bool:
    """Whether the dataset directory ``d`` holds this layout (its marker says so)."""
    marker = read_marker(d / "meta.json")
    return (
        isinstance(marker, dict)
        and marker.get("format") == MARKER_FORMAT
        and marker.get("layout") == LAYOUT
    )


def _widen(x: np.ndarray) -> np.ndarray:
    """float32 copy of ``x``, converted a block of rows at a time."""
    out = np.empty(x.shape, dtype=np.float32)
    for s in range(0, x.shape[0], _WIDEN_ROWS):
        out[s : s + _WIDEN_ROWS] = x[s : s + _WIDEN_ROWS]
    return out


def read_npy_dataset(d: Path, name: str, *, mmap: bool = False) -> Graph:
    """Load a dataset of the ``npy`` layout from its directory ``d``.

    Args:
        d: the dataset directory (``<root>/<name with - as _>``).
        name: the dataset's name.
        mmap: memory-map the arrays read-only (float16 features stay float16).

    Returns:
        The validated graph; ``meta["source"]`` holds the generator's parameters.

    Raises:
        DataError: a missing or malformed array file, or arrays that disagree.
    """
    marker = read_marker(d / "meta.json")
    if not isinstance(marker, dict):
        raise DataError(f"{d / 'meta.json'}: not a readable marker of `fullgraph data synth`")
    arrays: dict[str, np.ndarray | None] = {}
    for key in NPY_ARRAYS:
        path = d / ARRAYS_DIR / f"{key}.npy"
        if key == "x" and not marker.get("has_features", True):
            arrays[key] = None
            continue
        if not path.is_file():
            raise DataError(f"missing file: expected {path}")
        try:
            arrays[key] = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise DataError(f"{path}: not a readable .npy file ({exc}); write it again") from exc
    x = arrays["x"]
    want = marker.get("feature_dtype", "float32")
    if x is not None and x.dtype != np.dtype(want):
        raise DataError(f"{d / ARRAYS_DIR / 'x.npy'}: dtype {x.dtype}, meta.json says {want}")
    if x is not None and not mmap and x.dtype != np.float32:
        arrays["x"] = _widen(x)
    classes = marker.get("num_classes")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 0:
        raise DataError(f"{d / 'meta.json'}: num_classes must be a non-negative integer")
    indptr = arrays["indptr"]
    if indptr.ndim != 1 or indptr.shape[0] < 2:
        raise DataError(f"{d / ARRAYS_DIR / 'indptr.npy'}: shape {indptr.shape}, expected [N + 1]")
    meta = {"format": LAYOUT, "path": str(d), "symmetric": True, "missing": []}
    if "source" in marker:
        meta["source"] = marker["source"]
    if x is None:
        meta["missing"].append("features")
    graph = Graph(
        name=name,
        num_nodes=int(indptr.shape[0] - 1),
        num_classes=classes,
        meta=meta,
        **{k: arrays[k] for k in NPY_ARRAYS},
    )
    graph.validate()
    if mmap:  # validation read every page; do not keep them all resident in this process
        for array in arrays.values():
            drop_resident_pages(array)
    return graph
