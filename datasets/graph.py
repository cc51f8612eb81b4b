"""The in-memory graph type every loader returns and every other part consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fullgraph.errors import DataError


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

    @property
    def num_edges(self) -> int:
        """Number of directed edges (entries of the CSR)."""
        return int(self.indices.shape[0])

    @property
    def num_features(self) -> int:
        """Width of the feature matrix (0 when there are no features)."""
        return 0 if self.x is None else int(self.x.shape[1])

    def in_degree(self) -> np.ndarray:
        """In-degree of every node, int64 [num_nodes]."""
        return np.diff(self.indptr).astype(np.int64)

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
            if not np.isfinite(self.x).all():
                rows = np.unique(np.nonzero(~np.isfinite(self.x))[0])
                raise DataError(
                    f"{self.name}: features hold NaN or infinite values in {rows.size} rows "
                    f"(first: node {int(rows[0])})"
                )
        if self.y.shape != (n,):
            raise DataError(f"{self.name}: labels have shape {self.y.shape}, expected ({n},)")
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
        return self
