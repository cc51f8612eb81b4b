"""The node blocks a process has cut, kept for the same input again.

:func:`~fullgraph.partition.blocks.node_blocks` is a deterministic function of a graph's CSR
and training mask, the block size, the seed and the METIS library, and one process often asks
for the blocks of one graph more than once: ``fullgraph partition`` cuts them and its verifier
cuts them again to compare, ``fullgraph.pyg`` and the one-process part of
:func:`~fullgraph.partition.whole.whole_graph_part` cut the graph a partition was written from,
and a test session cuts its few fixture graphs hundreds of times. :data:`BLOCK_CACHE` keeps the
blocks of the last :data:`CACHE_GRAPHS` inputs, keyed by a digest of all of those inputs
(contents, not object identity: a graph changed in place, or rebuilt equal, is keyed by what
it holds); the cut itself stays in :mod:`~fullgraph.partition.blocks`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from fullgraph.datasets.graph import Graph

#: How many inputs' blocks :data:`BLOCK_CACHE` keeps (least recently used dropped first).
CACHE_GRAPHS = 8


@dataclass(frozen=True)
class CachedBlocks:
    """What one cut gave: ``block`` (int64 [num_nodes], kept private: callers get copies),
    ``num_blocks``, the METIS library that cut them, and the notes the cut appended."""

    block: np.ndarray
    num_blocks: int
    metis: str
    notes: tuple[str, ...]


def blocks_key(graph: Graph, block_size: int, seed: int, metis: str) -> str:
    """Hex SHA-256 of every input the blocks are a function of: the node count, the CSR
    (``indptr``, ``indices``) and ``train_mask`` (contents, dtypes, shapes), the block size, the
    seed, the
    METIS library asked for and, for ``auto`` and ``libmetis``, the libmetis they would load."""
    h = hashlib.sha256(f"{int(graph.num_nodes)} {int(block_size)} {int(seed)} {metis}".encode())
    if metis != "pymetis":
        from fullgraph.partition.libmetis import find_libmetis

        lib = find_libmetis()
        h.update(b" none" if lib is None else f" {lib.path} {lib.bits}".encode())
    for array in (graph.indptr, graph.indices, graph.train_mask):
        data = np.ascontiguousarray(array)
        h.update(f" {data.dtype.str} {data.shape} ".encode())
        h.update(data.view(np.uint8).ravel())
    return h.hexdigest()


class BlockCache:
    """The :class:`CachedBlocks` of the last ``size`` keys (:func:`blocks_key`), least
    recently used dropped first.

    Attributes:
        hits: lookups answered from the cache.
        misses: lookups that found nothing (the blocks are cut, then kept).
    """

    def __init__(self, size: int = CACHE_GRAPHS) -> None:
        self.size = size
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, CachedBlocks] = OrderedDict()

    key = staticmethod(blocks_key)

    def get(self, key: str) -> CachedBlocks | None:
        """The blocks kept under ``key`` (now the most recently used), or ``None``."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: CachedBlocks) -> None:
        """Keep ``entry`` (its block array copied) under ``key``."""
        self._entries[key] = CachedBlocks(
            entry.block.copy(), entry.num_blocks, entry.metis, tuple(entry.notes)
        )
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry and zero the counters."""
        self._entries.clear()
        self.hits = self.misses = 0


#: The process's cache (:func:`~fullgraph.partition.blocks.node_blocks` reads and fills it).
BLOCK_CACHE = BlockCache()
