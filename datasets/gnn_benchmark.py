"""Reader of gnn-benchmark ``.npz`` datasets: Amazon Computers/Photo, Coauthor CS/Physics.

gnn-benchmark (Shchur et al., 2018): ``raw/<file>.npz`` or a ``raw/<name>.zip`` holding it,
with the adjacency and the features as CSR pieces (``adj_data``, ``adj_indices``,
``adj_indptr``, ``adj_shape``, ``attr_*``) and ``labels``. There is no fixed split; the split
is seeded and per class: 20 training and 30 validation nodes of every class, the rest test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fullgraph.datasets.edges import edges_to_csr_with_values
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.npz_arrays import (
    check_finite,
    csr_arrays,
    labels,
    need_arrays,
    numbers,
    open_npz,
)
from fullgraph.datasets.paths import raw_dir
from fullgraph.datasets.split import per_class_split
from fullgraph.errors import DataError

#: Dataset name -> file name of the npz inside ``raw/`` (or inside ``raw/<name>.zip``).
GNN_BENCHMARK_FILES = {
    "amazon-computers": "amazon_electronics_computers.npz",
    "amazon-photo": "amazon_electronics_photo.npz",
    "coauthor-cs": "ms_academic_cs.npz",
    "coauthor-physics": "ms_academic_phy.npz",
}


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
    arrays, path = open_npz(raw, GNN_BENCHMARK_FILES[name], f"{name}.zip")
    need_arrays(arrays, ("adj_data", "adj_indices", "adj_indptr", "adj_shape", "labels"), path)
    indptr, dst, (n, n_cols) = csr_arrays(arrays, "adj", path)
    if n != n_cols:
        raise DataError(f"{path}: adj_shape is [{n}, {n_cols}], an adjacency must be square")
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # as scipy's tocoo().row
    x = None
    if any(f"attr_{k}" in arrays for k in ("data", "indices", "indptr", "shape")):
        f_indptr, f_indices, f_shape = csr_arrays(arrays, "attr", path)
        if f_shape[0] != n:
            raise DataError(f"{path}: attr_shape has {f_shape[0]} rows but adj_shape {n} nodes")
        x = (
            sp.csr_matrix((arrays["attr_data"], f_indices, f_indptr), shape=f_shape)
            .toarray()
            .astype(np.float32)
        )
    elif "attr_matrix" in arrays:
        x = numbers(arrays, "attr_matrix", path, 2)
        if x.shape[0] != n:
            raise DataError(f"{path}: attr_matrix has {x.shape[0]} rows but adj_shape {n} nodes")
        check_finite(x, "attr_matrix", path)  # as stored: 1e308 is refused before float32
        x = np.asarray(x, dtype=np.float32)
    y = labels(arrays, "labels", path, n)
    weights = np.asarray(arrays["adj_data"], dtype=np.float32)
    values = {"edge_weight": weights} if (weights != 1).any() else {}  # binary: no weights
    indptr, indices, values = edges_to_csr_with_values(
        src,
        dst,
        n,
        values,
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
        edge_weight=values.get("edge_weight"),
    )
    return graph.validate()
