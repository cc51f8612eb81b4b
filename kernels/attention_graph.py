"""The edge structure GAT's attention runs over: a rank's in-edges without self-loops.

:meth:`AttentionGraph.of` builds it once per :class:`~fullgraph.kernels.csr.CSRMatrix` and keeps
it on that matrix (dropped with it); the graph keeps what the back-ends derive from it (numpy
views, the transpose, row ranges per thread, edge lists per device).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fullgraph.kernels.cpu_launch import row_ranges
from fullgraph.kernels.csr import CSRMatrix

#: The attribute of a CSRMatrix holding ``(global_ids, its AttentionGraph)``.
_KEPT_AS = "_attention_graph"


def _by_global_id(indptr: torch.Tensor, indices: torch.Tensor, gids: np.ndarray) -> torch.Tensor:
    """``indices`` with every row's entries in ascending global id (stable: duplicates keep
    their order), on ``indices``'s device; ``indices`` itself when they ascend already."""
    cols = indices.cpu().numpy()
    keys = gids[cols]
    rows = np.repeat(np.arange(indptr.numel() - 1, dtype=np.int64), np.diff(indptr.cpu().numpy()))
    ascending = np.ones(keys.size, dtype=bool)
    ascending[1:] = (keys[1:] >= keys[:-1]) | (rows[1:] != rows[:-1])
    if bool(ascending.all()):
        return indices
    order = np.lexsort((keys, rows))
    return torch.from_numpy(cols[order]).to(indices.device)


@dataclass(eq=False)
class AttentionGraph:
    """A rank's in-edges for attention: CSR rows = inner nodes, columns = local ids.

    Self-loops of the input are dropped (the kernels add one per row, as PyG's ``GATConv``
    removes and re-adds them), and every row's entries ascend in global id of the source
    (duplicates in their order): the kernels' row sums then add their terms in the same order
    at every rank count. The transpose (for the backward's column pass), the row ranges
    per thread and the torch back-end's edge lists are built on first use and kept.

    Attributes:
        indptr: int64 [num_inner + 1].
        indices: int64 [E] local column ids.
        global_ids: global id of every local node, int64 [num_local] (numpy).
        num_inner: rows.
        num_local: columns (inner + halo).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    global_ids: np.ndarray
    num_inner: int
    num_local: int
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, structure: CSRMatrix, global_ids: np.ndarray | None) -> AttentionGraph:
        """The graph of ``structure`` (built once per structure and kept with it).

        Args:
            structure: local CSR of incoming edges (rows = inner nodes, columns = local ids).
            global_ids: global id of every local node; ``None``: local ids are global.
        """
        kept = getattr(structure, _KEPT_AS, None)
        if kept is not None and kept[0] is global_ids:
            return kept[1]
        indptr = structure.indptr.to(torch.int64)
        indices = structure.indices.to(torch.int64)
        rows = structure.row_of_entry()
        loops = indices == rows
        if bool(loops.any()):
            keep = ~loops
            before = torch.zeros(indices.numel() + 1, dtype=torch.int64, device=indices.device)
            torch.cumsum(keep, 0, out=before[1:])
            indptr, indices = before[indptr], indices[keep]
        if global_ids is None:
            gids = np.arange(structure.num_cols, dtype=np.int64)
        else:
            gids = np.ascontiguousarray(global_ids, dtype=np.int64)
        if gids.shape[0] != structure.num_cols:
            raise ValueError(f"{gids.shape[0]} global ids for {structure.num_cols} local nodes")
        indices = _by_global_id(indptr, indices, gids)
        graph = cls(
            indptr.contiguous(), indices.contiguous(), gids, structure.num_rows, structure.num_cols
        )
        setattr(structure, _KEPT_AS, (global_ids, graph))
        return graph

    @property
    def num_edges(self) -> int:
        """In-edges without the self-loops."""
        return int(self.indices.numel())

    def transpose(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t_indptr [num_local + 1], t_rows [E], t_edge [E])``: the edges by source node;
        ``t_edge`` is every transposed entry's position in :attr:`indices` (int64 numpy)."""
        if "t" not in self._cache:
            cols = self.indices.cpu().numpy()
            order = np.argsort(cols, kind="stable").astype(np.int64)
            counts = np.bincount(cols, minlength=self.num_local)
            t_indptr = np.zeros(self.num_local + 1, dtype=np.int64)
            np.cumsum(counts, out=t_indptr[1:])
            rows = np.repeat(np.arange(self.num_inner, dtype=np.int64), np.diff(self.indptr_np()))
            self._cache["t"] = (t_indptr, rows[order], order)
        return self._cache["t"]

    def indptr_np(self) -> np.ndarray:
        """:attr:`indptr` as numpy (CPU)."""
        if "indptr" not in self._cache:
            self._cache["indptr"] = self.indptr.cpu().numpy()
        return self._cache["indptr"]

    def indices_np(self) -> np.ndarray:
        """:attr:`indices` as numpy (CPU)."""
        if "indices" not in self._cache:
            self._cache["indices"] = self.indices.cpu().numpy()
        return self._cache["indices"]

    def row_ranges(self, threads: int) -> np.ndarray:
        """Row ranges with about equal edges for ``threads`` threads."""
        key = ("rows", threads)
        if key not in self._cache:
            self._cache[key] = row_ranges(self.indptr_np(), threads)
        return self._cache[key]

    def column_ranges(self, threads: int) -> np.ndarray:
        """Column ranges (of the transpose) with about equal edges for ``threads`` threads."""
        key = ("cols", threads)
        if key not in self._cache:
            self._cache[key] = row_ranges(self.transpose()[0], threads)
        return self._cache[key]

    def edges_with_loops(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, cols)`` of every edge, the self-loops last, int64 [E + num_inner] (torch)."""
        key = ("edges", str(device))
        if key not in self._cache:
            counts = self.indptr[1:] - self.indptr[:-1]
            own = torch.arange(self.num_inner, dtype=torch.int64, device=self.indptr.device)
            rows = torch.cat([torch.repeat_interleave(own, counts), own]).to(device)
            cols = torch.cat([self.indices, own]).to(device)
            self._cache[key] = (rows, cols)
        return self._cache[key]

    def gids_tensor(self, device: torch.device) -> torch.Tensor:
        """:attr:`global_ids` as an int64 tensor on ``device``."""
        key = ("gids", str(device))
        if key not in self._cache:
            self._cache[key] = torch.from_numpy(self.global_ids).to(device)
        return self._cache[key]
