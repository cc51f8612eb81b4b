"""The in-memory graph type every loader returns and every other part consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fullgraph.errors import DataError

#: The split masks of a graph or a part, in the order messages name them.
SPLITS = ("train_mask", "val_mask", "test_mask")
#: The arrays of a :class:`Graph` on disk (the OGB reader's cache, ``verify``'s page drops).
GRAPH_ARRAYS = ("indptr", "indices", "x", "y", *SPLITS, "edge_weight", "edge_attr")


def first_overlap(masks: dict[str, np.ndarray]) -> tuple[str, str, int] | None:
    """The first node that two split masks both hold.

    Args:
        masks: bool masks of equal length by name (``train_mask``, ``val_mask``, ...).

    Returns:
        ``(name_a, name_b, node)`` for the first overlapping pair (in the order of ``masks``)
        and the lowest node in both, or ``None`` when the masks are disjoint.
    """
    names = list(masks)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = np.logical_and(masks[a], masks[b])
            if both.any():
                return a, b, int(np.argmax(both))
    return None


def split_name(mask_name: str) -> str:
    """``train_mask`` -> ``train`` (the word messages use for a split)."""
    return mask_name.removesuffix("_mask")


#: :func:`nonfinite_rows` drops a memory-mapped matrix's pages every this many blocks.
DROP_EVERY = 8


def nonfinite_rows(x: np.ndarray, block_rows: int = 1 << 16) -> np.ndarray:
    """Rows of ``x`` holding a NaN or an infinity, ascending.

    Checked in blocks of ``block_rows`` rows, so that the temporary mask stays small for a
    feature matrix of any size (a memory-mapped one is read once, block by block, its pages
    dropped from the process every :data:`DROP_EVERY` blocks: the check of a graph larger
    than memory holds a few blocks of it, not all).

    Shapes:
        - ``x``: [num_nodes, num_features]; result: int64 [rows found]
    """
    from fullgraph.resources import drop_resident_pages

    found = []
    for k, lo in enumerate(range(0, x.shape[0], block_rows)):
        found.append(lo + np.flatnonzero(~np.isfinite(x[lo : lo + block_rows]).all(axis=1)))
        if k % DROP_EVERY == DROP_EVERY - 1:
            drop_resident_pages(x)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


@dataclass
class Graph:
    """A node-classification graph held as CSR of incoming edges.

    Row ``v`` of the CSR lists the sources ``u`` of the edges ``u -> v``:
    ``indices[indptr[v]:indptr[v+1]]``. Loaders symmetrise and remove self-loops and
    duplicates unless asked otherwise, so for them in-degree equals out-degree.

    Shapes:
        - ``indptr``: int64 [num_nodes + 1]
        - ``indices``: int64 [num_edges]
        - ``x``: float32 [num_nodes, num_features] (``None`` when the source ships none)
        - ``y``: int64 [num_nodes] (``-1`` marks an unlabelled node)
        - ``train_mask``, ``val_mask``, ``test_mask``: bool [num_nodes]
        - ``edge_weight``: float32 [num_edges] or ``None``; ``edge_attr``: float32
          [num_edges, edge_dim] or ``None``: per-edge values in the order of ``indices`` (edge
          ``e`` is ``indices[e] -> v`` for the row ``v`` holding ``e``); loaders keep them
          aligned through their edge operations
          (:func:`~fullgraph.datasets.edges.edges_to_csr_with_values`).
        - ``node_ids``: int64 [num_nodes], ascending, or ``None``: a receptive-field cut of a
          larger graph (:mod:`~fullgraph.partition.receptive_cut`) keeps every node's id in
          that graph (the key of its dropout stream and what ``predict`` writes), and
          ``full_in_degree`` / ``full_in_weight`` its in-degree there (what GCN's
          normalisation reads), where the cut's own CSR lacks edges.
    """

    name: str
    num_nodes: int
    indptr: np.ndarray
    indices: np.ndarray
    x: np.ndarray | None
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    meta: dict = field(default_factory=dict)
    edge_weight: np.ndarray | None = None
    edge_attr: np.ndarray | None = None
    node_ids: np.ndarray | None = None
    full_in_degree: np.ndarray | None = None
    full_in_weight: np.ndarray | None = None

    @property
    def edge_dim(self) -> int:
        """Width of the edge feature rows (0 when there are none)."""
        return 0 if self.edge_attr is None else int(self.edge_attr.shape[1])

    @property
    def num_edges(self) -> int:
        """Number of directed edges (entries of the CSR)."""
        return int(self.indices.shape[0])

    @property
    def num_features(self) -> int:
        """Width of the feature matrix (0 when there are no features)."""
        return 0 if self.x is None else int(self.x.shape[1])

    def in_degree(self) -> np.ndarray:
        """In-degree of every node, int64 [num_nodes] (in the uncut graph, for a cut)."""
        if self.full_in_degree is not None:
            return self.full_in_degree
        return np.diff(self.indptr).astype(np.int64)

    def in_weight(self) -> np.ndarray | None:
        """Weighted in-degree of every node (the sum of its incoming edge weights, added in CSR
        order; in the uncut graph, for a cut), float64 [num_nodes]; ``None`` without edge
        weights."""
        if self.full_in_weight is not None:
            return self.full_in_weight
        if self.edge_weight is None:
            return None
        rows = np.repeat(np.arange(self.num_nodes), np.diff(self.indptr))
        w = np.asarray(self.edge_weight, dtype=np.float64)
        return np.bincount(rows, weights=w, minlength=self.num_nodes)

    def validate(self) -> Graph:
        """Check shapes, dtypes, id ranges and values; raise :class:`DataError` naming the problem.

        Returns:
            ``self``, so that loaders can ``return graph.validate()``.
        """
        n = self.num_nodes
        if n < 1:
            raise DataError(f"{self.name}: graph has no nodes")
        if self.indptr.shape != (n + 1,):
            raise DataError(
                f"{self.name}: indptr has shape {self.indptr.shape}, expected ({n + 1},)"
            )
        if self.indptr[0] != 0 or np.any(np.diff(self.indptr) < 0):
            raise DataError(f"{self.name}: indptr must start at 0 and be non-decreasing")
        if self.indptr[-1] != self.indices.shape[0]:
            raise DataError(
                f"{self.name}: indptr ends at {self.indptr[-1]} but there are "
                f"{self.indices.shape[0]} edge indices"
            )
        if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= n):
            bad = int(self.indices.max() if self.indices.max() >= n else self.indices.min())
            raise DataError(f"{self.name}: edge endpoint {bad} out of range [0, {n})")
        if self.x is not None:
            if self.x.ndim != 2 or self.x.shape[0] != n:
                raise DataError(
                    f"{self.name}: features have shape {self.x.shape}, expected ({n}, F)"
                )
            rows = nonfinite_rows(self.x)
            if rows.size:
                raise DataError(
                    f"{self.name}: features hold NaN or infinite values in {rows.size} rows "
                    f"(first: node {int(rows[0])})"
                )
        self.validate_edge_values()
        if self.y.shape != (n,):
            raise DataError(f"{self.name}: labels have shape {self.y.shape}, expected ({n},)")
        if self.y.size and self.y.min() < -1:
            raise DataError(f"{self.name}: label {int(self.y.min())} is negative (-1 = unlabelled)")
        labelled = self.y[self.y >= 0]
        if labelled.size and labelled.max() >= self.num_classes:
            raise DataError(
                f"{self.name}: label {int(labelled.max())} out of range for "
                f"{self.num_classes} classes"
            )
        for mname in ("train_mask", "val_mask", "test_mask"):
            m = getattr(self, mname)
            if m.shape != (n,) or m.dtype != np.bool_:
                raise DataError(f"{self.name}: {mname} must be bool of shape ({n},)")
            if np.any(self.y[m] < 0):
                raise DataError(f"{self.name}: {mname} holds unlabelled nodes")
        overlap = first_overlap({k: getattr(self, k) for k in SPLITS})
        if overlap is not None:
            a, b, v = overlap
            raise DataError(
                f"{self.name}: node {v} is in both the {split_name(a)} and the {split_name(b)} "
                f"split; a node may be in one split only"
            )
        return self

    def validate_edge_values(self) -> None:
        """Shapes and finiteness of ``edge_weight`` and ``edge_attr``."""
        m = self.num_edges
        for key, ndim in (("edge_weight", 1), ("edge_attr", 2)):
            v = getattr(self, key)
            if v is None:
                continue
            if v.ndim != ndim or v.shape[0] != m:
                want = f"({m},)" if ndim == 1 else f"({m}, F)"
                raise DataError(f"{self.name}: {key} has shape {v.shape}, expected {want}")
            bad = ~np.isfinite(v.reshape(m, -1)).all(axis=1)
            if bad.any():
                raise DataError(
                    f"{self.name}: {key} holds NaN or infinite values on {int(bad.sum())} edges "
                    f"(first: edge {int(np.argmax(bad))}); edge values must be finite"
                )
