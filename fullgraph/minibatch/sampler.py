"""Uniform neighbour sampling without replacement into per-layer bipartite blocks.

The sampler works on the CSR of incoming edges (row ``v`` lists the sources of ``u -> v``). For
a batch of seed nodes and fanouts ``[k1, k2, ..., kL]`` (``k1`` applies to the seeds, as in
PyG's ``num_neighbors``) it draws, hop by hop, at most ``k`` distinct in-neighbours of every
destination node (all of them when the in-degree is at most ``k``) and relabels the nodes
locally:

* ``nodes`` (global ids) starts with the seeds, then the nodes first reached at hop 1, then
  those first reached at hop 2, and so on, so that the destination nodes of every block are a
  prefix of its source nodes (destination local id ``i`` is source local id ``i``);
* the block of hop ``h`` has ``num_dst = n_{h-1}`` rows and ``num_src = n_h`` columns, where
  ``n_h`` is the number of nodes reached within ``h`` hops;
* ``blocks`` are returned in layer order: ``blocks[0]`` is the outermost hop and consumes the
  input features of ``nodes[:blocks[0].num_src]``; ``blocks[-1]`` has the seeds as rows.

Randomness is counter based (a SplitMix64 hash of the key, the destination node and the draw
index), so a batch is a pure function of ``(seed, epoch, batch, hop)`` and the graph: the same
on any machine, with any thread count, in any process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

from fullgraph.errors import ConfigError
from fullgraph.hashing import GOLDEN, fold_key, mix64_u64

#: Odd multiplier that spreads the draw index before hashing (splitmix64's gamma of a second
#: stream).
_DRAW_GAMMA = np.uint64(0xD1B54A32D192ED03)
_UGOLDEN = np.uint64(GOLDEN)


def mix_key(*parts: int) -> int:
    """Fold non-negative integers into one 64-bit key (:func:`fullgraph.hashing.fold_key`).

    Args:
        parts: e.g. ``(seed, epoch, batch, hop)``.

    Returns:
        An integer in ``[0, 2**64)``.
    """
    return fold_key(*parts)


@numba.njit(inline="always")
def _hash3(key: np.uint64, a: np.uint64, b: np.uint64) -> np.uint64:
    return mix64_u64(key ^ (a * _UGOLDEN) ^ (b * _DRAW_GAMMA))


#: Below this many destination nodes a hop is sampled on one thread: a parallel region costs
#: more than it saves, and on a busy machine its barrier waits for descheduled threads.
PARALLEL_MIN_ROWS = 4096


@numba.njit(cache=True, nogil=True)
def _fill_rows(indptr, indices, dst, fanout, key, out_ptr, picks, lo, hi):  # pragma: no cover
    """Write the sampled in-neighbours of ``dst[lo:hi]`` into ``picks`` (CSR by ``out_ptr``)."""
    for i in range(lo, hi):
        v = dst[i]
        start = indptr[v]
        deg = indptr[v + 1] - start
        o = out_ptr[i]
        if deg <= fanout:
            for j in range(deg):
                picks[o + j] = indices[start + j]
            continue
        # Floyd's algorithm: a uniform k-subset of range(deg), k = fanout, no replacement.
        m = 0
        for j in range(deg - fanout, deg):
            r = _hash3(key, np.uint64(v), np.uint64(j))
            t = np.int64(((r >> np.uint64(32)) * np.uint64(j + 1)) >> np.uint64(32))
            for q in range(m):
                if picks[o + q] == t:
                    t = j
                    break
            picks[o + m] = t
            m += 1
        for q in range(fanout):
            picks[o + q] = indices[start + picks[o + q]]


@numba.njit(parallel=True, cache=True)
def _fill_rows_parallel(
    indptr, indices, dst, fanout, key, out_ptr, picks, chunks
):  # pragma: no cover
    """:func:`_fill_rows` over ``chunks`` equal row ranges in parallel."""
    n = dst.shape[0]
    for c in numba.prange(chunks):
        _fill_rows(
            indptr,
            indices,
            dst,
            fanout,
            key,
            out_ptr,
            picks,
            c * n // chunks,
            (c + 1) * n // chunks,
        )


def _sample_rows(
    indptr: np.ndarray, indices: np.ndarray, dst: np.ndarray, fanout: int, key: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sampled in-neighbours (global ids) of every node of ``dst``, as ``(indptr, picks)``."""
    deg = indptr[dst + 1] - indptr[dst]
    out_ptr = np.zeros(dst.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.minimum(deg, fanout), out=out_ptr[1:])
    picks = np.empty(int(out_ptr[-1]), dtype=np.int64)
    ukey = np.uint64(key)
    if dst.shape[0] >= PARALLEL_MIN_ROWS and numba.get_num_threads() > 1:
        chunks = 8 * numba.get_num_threads()
        _fill_rows_parallel(indptr, indices, dst, fanout, ukey, out_ptr, picks, chunks)
    else:
        _fill_rows(indptr, indices, dst, fanout, ukey, out_ptr, picks, 0, dst.shape[0])
    return out_ptr, picks


@numba.njit(cache=True)
def _relabel(picks, node_map, nodes, num_nodes):  # pragma: no cover - compiled
    """Local ids of ``picks``; unseen nodes are appended to ``nodes`` in order of appearance."""
    local = np.empty(picks.shape[0], dtype=np.int64)
    n = num_nodes
    for e in range(picks.shape[0]):
        g = picks[e]
        lid = node_map[g]
        if lid < 0:
            lid = n
            node_map[g] = n
            nodes[n] = g
            n += 1
        local[e] = lid
    return local, n


@dataclass
class Block:
    """One sampled bipartite layer: rows are destination nodes, columns are source nodes.

    Destination local id ``i`` equals source local id ``i`` (destinations are a prefix).

    Shapes:
        - ``indptr``: int64 [num_dst + 1]
        - ``indices``: int64 [num_edges], local source ids in ``[0, num_src)``
    """

    indptr: np.ndarray
    indices: np.ndarray
    num_dst: int
    num_src: int

    @property
    def num_edges(self) -> int:
        """Number of sampled edges in this block."""
        return int(self.indices.shape[0])


@dataclass
class SampledBatch:
    """The computation graph of one mini-batch.

    Shapes:
        - ``nodes``: int64 [num_nodes], global ids; ``nodes[:num_seeds]`` are the seeds and
          ``nodes[:blocks[0].num_src]`` the nodes whose input features the first layer reads.
    """

    nodes: np.ndarray
    num_seeds: int
    blocks: list[Block]

    @property
    def seeds(self) -> np.ndarray:
        """Global ids of the seed (output) nodes."""
        return self.nodes[: self.num_seeds]

    @property
    def num_sampled_edges(self) -> int:
        """Total number of sampled edges over all blocks."""
        return sum(b.num_edges for b in self.blocks)


class NeighborSampler:
    """Samples per-layer bipartite blocks around seed nodes from an incoming-edge CSR.

    Args:
        indptr: int64 [N + 1] CSR row pointer of incoming edges.
        indices: int64 [E] source node of every edge.
        fanouts: neighbours drawn per destination node at hop 1, 2, ... (``fanouts[0]`` applies
            to the seeds); ``-1`` takes all neighbours.
        seed: base seed; every batch is a pure function of ``(seed, epoch, batch)``.

    Example:
        >>> s = NeighborSampler(g.indptr, g.indices, [15, 10, 5], seed=0)  # doctest: +SKIP
        >>> batch = s.sample(np.array([3, 7]), epoch=0, batch=0)  # doctest: +SKIP
    """

    def __init__(
        self, indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[int], seed: int = 0
    ) -> None:
        if len(fanouts) == 0:
            raise ConfigError("fanouts must list at least one hop")
        bad = [f for f in fanouts if f == 0 or f < -1]
        if bad:
            raise ConfigError(f"fanout {bad[0]} is invalid: use a positive count or -1 for all")
        if indptr.ndim != 1 or indptr.shape[0] < 2 or indptr[-1] != indices.shape[0]:
            raise ConfigError(
                f"CSR mismatch: indptr ends at {int(indptr[-1])} but there are "
                f"{indices.shape[0]} indices"
            )
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int64)
        self.num_nodes = int(self.indptr.shape[0] - 1)
        max_deg = int(np.diff(self.indptr).max())
        self.fanouts = [max_deg if f == -1 else int(f) for f in fanouts]
        self.seed = int(seed)
        # global id -> local id of the batch being sampled; -1 between calls (reset entry by
        # entry, so a batch costs what it touches, not a pass over all nodes)
        self._node_map = np.full(self.num_nodes, -1, dtype=np.int64)

    def sample(self, seeds: np.ndarray, epoch: int = 0, batch: int = 0) -> SampledBatch:
        """Sample the blocks of ``len(fanouts)`` hops around ``seeds``.

        Args:
            seeds: int64 [B] distinct global node ids.
            epoch: epoch number (part of the random key).
            batch: batch number within the epoch (part of the random key).

        Returns:
            The :class:`SampledBatch`, blocks in layer order (outermost hop first).

        Raises:
            ConfigError: a seed is out of range or repeated.
        """
        seeds = np.ascontiguousarray(seeds, dtype=np.int64)
        if seeds.ndim != 1 or seeds.size == 0:
            raise ConfigError("seeds must be a non-empty 1-D array of node ids")
        if seeds.min() < 0 or seeds.max() >= self.num_nodes:
            bad = int(seeds.max() if seeds.max() >= self.num_nodes else seeds.min())
            raise ConfigError(f"seed node {bad} out of range [0, {self.num_nodes})")
        if np.unique(seeds).size != seeds.size:
            raise ConfigError(f"seeds hold repeated node ids ({seeds.size} given)")
        node_map = self._node_map  # all -1 between calls: entries set here are reset below
        node_map[seeds] = np.arange(seeds.size, dtype=np.int64)
        # Upper bound of the node count: seeds times the product of (1 + fanout), capped at N.
        bound = seeds.size
        for f in self.fanouts:
            bound = min(bound * (1 + f), self.num_nodes)
        nodes = np.empty(bound, dtype=np.int64)
        nodes[: seeds.size] = seeds
        num = seeds.size
        hop_blocks: list[Block] = []
        try:
            for hop, fanout in enumerate(self.fanouts, start=1):
                key = mix_key(self.seed, epoch, batch, hop)
                dst = nodes[:num]
                ptr, picks = _sample_rows(self.indptr, self.indices, dst, fanout, key)
                local, new_num = _relabel(picks, node_map, nodes, num)
                hop_blocks.append(Block(ptr, local, num_dst=num, num_src=int(new_num)))
                num = int(new_num)
        except BaseException:
            node_map.fill(-1)  # a failed hop may have set entries beyond nodes[:num]
            raise
        node_map[nodes[:num]] = -1
        return SampledBatch(nodes=nodes[:num].copy(), num_seeds=seeds.size, blocks=hop_blocks[::-1])


def global_batches(
    train_nodes: np.ndarray, batch_size: int, seed: int, epoch: int
) -> list[np.ndarray]:
    """The global seed batches of one epoch: a ``(seed, epoch)`` permutation cut in pieces.

    Every rank computes the same list, so the batches do not depend on the rank count.

    Args:
        train_nodes: int64 [T] global ids of the training nodes.
        batch_size: global batch size (summed over ranks).
        seed: base seed.
        epoch: epoch number.

    Returns:
        ``ceil(T / batch_size)`` int64 arrays; the last one may be shorter.

    Raises:
        ConfigError: ``batch_size`` is not positive.
    """
    if batch_size < 1:
        raise ConfigError(f"batch size must be positive, got {batch_size}")
    rng = np.random.default_rng(mix_key(seed, epoch, 0xB47C4))
    perm = np.asarray(train_nodes, dtype=np.int64)[rng.permutation(len(train_nodes))]
    return [perm[s : s + batch_size] for s in range(0, perm.shape[0], batch_size)]


def rank_share(batch: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous share of a global batch (``np.array_split`` order).

    The shares of ranks ``0 .. world_size - 1`` concatenate back to ``batch``; a share may be
    empty when the batch is shorter than ``world_size``.
    """
    return np.array_split(batch, world_size)[rank]
