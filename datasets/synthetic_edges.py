"""Edge samplers of the synthetic graphs: where the two ends of every edge land.

Two models share one drawing loop (:func:`draw_edges`: draw in fixed-size chunks, drop
self-loops and duplicates, draw again until exactly ``num_edges`` distinct undirected edges):

- :class:`UniformSampler` ("uniform", the stress model): an edge stays in its first end's
  community with probability ``p_local``, otherwise its second end is any node of the graph
  (proportional to propensity). Every cross-community edge is a random long-range edge, so
  METIS cannot keep them inside parts: a worst case for halo exchange.
- :class:`RingSampler` ("ring", the realistic model): communities sit on a ring (think of a
  1-D map of topics, or of product categories, where neighbours are related). An edge's first
  end ``v`` is drawn by popularity (heavy-tailed). The edge stays in ``v``'s community with
  probability ``p_local``; otherwise it picks a reach level ``L >= 1`` with probability
  proportional to ``reach_decay ** L`` and its second end inside the window of
  ``2 * block_size * 2 ** (L - 1)`` ring positions centred on ``v``, by activity
  (light-tailed). The windows are nested, so most cross-community edges link nearby
  communities and few span the graph: the super-community structure that keeps real graphs'
  METIS halos small. The last level covers the whole ring; ``reach_decay`` -> infinity sends
  every cross-community edge there (uniform placement with ring-model degrees).

Hubs (degree-correlated reach): an edge of ``v`` uses at least the smallest level whose window
holds :data:`HUB_SPREAD` times ``v``'s popularity, so a node of degree 10k spreads its edges
over a region of 20k nodes instead of saturating its community, and a hub lies in the halo of
many parts, as popular papers or products do. Second ends are drawn by activity, not
popularity, so no community piles its edges onto its hub either.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np

from fullgraph.errors import ConfigError

__all__ = [
    "SURPLUS",
    "KeysInMemory",
    "RingSampler",
    "UniformSampler",
    "draw_edges",
    "power_law",
    "sorted_distinct",
    "surplus_positions",
]

log = logging.getLogger(__name__)

#: Edges drawn per chunk; fixed so that outputs do not depend on memory.
CHUNK = 4_000_000

#: A node's own edges reach a window holding at least this many times its expected degree.
HUB_SPREAD = 2.0

#: How the distinct edges drawn beyond ``num_edges`` are dropped: ``global``, a seeded sample
#: of all positions at once (``rng.choice``: a transient of 8 bytes per edge; the older
#: presets, kept bit for bit), or ``blocked``, the same count spread over fixed blocks of
#: :data:`SURPLUS_BLOCK` positions in proportion, a seeded sample in each (bounded memory).
SURPLUS = ("global", "blocked")
SURPLUS_BLOCK = 1 << 22


def _pareto(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """``n`` Pareto draws (minimum 1) whose density falls as ``x ** -exponent``."""
    return (1.0 - rng.random(n)) ** (-1.0 / (exponent - 1.0))


def power_law(
    rng: np.random.Generator, num_nodes: int, mean: float, exponent: float, cap: float
) -> np.ndarray:
    """Power-law weights with a given mean, none above ``cap``.

    Args:
        rng: the structure stream.
        num_nodes: number of weights.
        mean: their mean (after capping).
        exponent: the density falls as ``w ** -exponent`` (> 1).
        cap: largest weight; draws above it are cut to it (0: no cap).

    Returns:
        float64 [num_nodes].

    Raises:
        ConfigError: ``cap`` not above ``mean``.
    """
    theta = _pareto(rng, num_nodes, exponent)
    scale = mean / theta.mean()
    if cap <= 0:
        return theta * scale
    if cap <= mean:
        raise ConfigError(f"max_degree {cap} must exceed the mean {mean:.1f}")
    for _ in range(100):  # fixed point: the scale at which the capped mean is the target
        new = mean / np.minimum(theta, cap / scale).mean()
        if abs(new - scale) <= 1e-12 * scale:
            break
        scale = new
    return np.minimum(theta * scale, cap)


def _keys(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Undirected edge keys ``min * n + max``, self-loops dropped."""
    keep = src != dst
    lo = np.minimum(src[keep], dst[keep])
    hi = np.maximum(src[keep], dst[keep])
    return lo * np.int64(n) + hi


class UniformSampler:
    """The stress model: a cross-community edge goes to any node (proportional to ``theta``).

    Args:
        theta: propensity of every node (first ends and second ends are drawn in proportion).
        block: community of every node.
        num_blocks: number of communities.
        p_local: probability that an edge stays in its first end's community.
    """

    def __init__(
        self, theta: np.ndarray, block: np.ndarray, num_blocks: int, p_local: float
    ) -> None:
        self.cum = np.cumsum(theta)
        self.order = np.argsort(block, kind="stable")
        self.cum_block = np.cumsum(theta[self.order])
        counts = np.bincount(block, minlength=num_blocks)
        self.end = np.cumsum(counts)  # exclusive end position of each block in `order`
        self.begin = self.end - counts
        weights = np.bincount(block, weights=theta, minlength=num_blocks)
        self.w_end = np.cumsum(weights)
        self.w_begin = self.w_end - weights
        self.block = block
        self.p_local = p_local

    def sources(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """``k`` first ends, drawn proportional to ``theta``."""
        u = rng.random(k) * self.cum[-1]
        return np.minimum(np.searchsorted(self.cum, u, side="right"), self.cum.shape[0] - 1)

    def _local_ends(self, rng: np.random.Generator, src: np.ndarray) -> np.ndarray:
        b = self.block[src]
        u = self.w_begin[b] + rng.random(src.shape[0]) * (self.w_end[b] - self.w_begin[b])
        pos = np.searchsorted(self.cum_block, u, side="right")
        pos = np.clip(pos, self.begin[b], self.end[b] - 1)
        return self.order[pos]

    def keys(self, rng: np.random.Generator, src: np.ndarray) -> np.ndarray:
        """Undirected edge keys ``min*N + max`` (self-loops dropped) for edges from ``src``."""
        local = rng.random(src.shape[0]) < self.p_local
        dst = np.empty_like(src)
        dst[local] = self._local_ends(rng, src[local])
        dst[~local] = self.sources(rng, int((~local).sum()))
        return _keys(src, dst, self.cum.shape[0])


class RingSampler:
    """The realistic model: communities on a ring, cross-community edges to nested windows.

    An edge's first end ``v`` is drawn in proportion to its popularity (heavy-tailed), its
    reach level ``L`` as described in the module docstring (at least ``v``'s own level), and
    its second end inside ``v``'s level-``L`` window in proportion to activity (light-tailed).

    Args:
        popularity: expected number of edges of which a node is the first end (float > 0).
        activity: weight of a node as a second end (float > 0).
        block: community of every node; communities ``0, 1, ...`` follow each other on the ring.
        num_blocks: number of communities.
        p_local: probability that an edge stays in its first end's community.
        reach_decay: ratio of the probabilities of reach levels ``L + 1`` and ``L``.
    """

    def __init__(
        self,
        popularity: np.ndarray,
        activity: np.ndarray,
        block: np.ndarray,
        num_blocks: int,
        p_local: float,
        reach_decay: float,
    ) -> None:
        n = popularity.shape[0]
        self.n = n
        self.order = np.argsort(block, kind="stable")  # ring position -> node
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[self.order] = np.arange(n)
        counts = np.bincount(block, minlength=num_blocks)
        self.end = np.cumsum(counts)  # exclusive ring end of each community
        self.begin = self.end - counts
        self.block = block
        # Half-widths (ring positions) of the windows of levels 1, 2, ...; the last covers all.
        unit = max(1, round(n / num_blocks))
        half = [0]
        while 2 * half[-1] + 1 < n:
            half.append(unit * 2 ** (len(half) - 1))
        self.half = np.asarray(half, dtype=np.int64)
        levels = self.half.shape[0]
        size = np.minimum(2 * self.half + 1, n).astype(np.float64)
        size[0] = unit
        q = np.ones(1)
        if levels > 1:
            log_far = np.arange(1, levels, dtype=np.float64) * np.log(reach_decay)
            far = np.exp(log_far - log_far.max())  # ~ reach_decay ** L, without overflow
            q = np.concatenate([[p_local], (1.0 - p_local) * far / far.sum()])
        self.level_probs = q
        self.cum_q = np.cumsum(q)
        self.cum_q[-1] = 1.0
        # A popular node's edges reach at least a window holding HUB_SPREAD x its degree.
        self.own_level = np.minimum(
            np.searchsorted(size, HUB_SPREAD * popularity, side="left"), levels - 1
        )
        self.cum_src = np.cumsum(popularity)
        self.cum_w = np.zeros(n + 1)
        np.cumsum(activity[self.order], out=self.cum_w[1:])
        log.info(
            "ring sampler: window half-widths %s, level probabilities %s",
            self.half.tolist(),
            np.round(q, 4).tolist(),
        )

    def sources(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """``k`` first ends, proportional to popularity."""
        u = rng.random(k) * self.cum_src[-1]
        return np.minimum(np.searchsorted(self.cum_src, u, side="right"), self.n - 1)

    def _window_ends(self, rng: np.random.Generator, src: np.ndarray, lvl: int) -> np.ndarray:
        """Second ends in the level-``lvl`` window around ``src`` (ring wraps around)."""
        n = self.n
        cum = self.cum_w
        total = cum[-1]
        if lvl == 0:
            b = self.block[src]
            lo, hi = self.begin[b], self.end[b]
        elif 2 * self.half[lvl] + 1 >= n:
            lo = np.zeros(src.shape[0], dtype=np.int64)
            hi = np.full(src.shape[0], n, dtype=np.int64)
        else:
            p = self.pos[src]
            lo, hi = p - self.half[lvl], p + self.half[lvl] + 1

        def before(x: np.ndarray) -> np.ndarray:  # weight of ring positions < x (unwrapped)
            turns, rem = np.divmod(x, n)
            return turns * total + cum[rem]

        f_lo = before(lo)
        u = f_lo + rng.random(src.shape[0]) * (before(hi) - f_lo)
        turns = np.floor(u / total)
        rem = np.searchsorted(cum, u - turns * total, side="right") - 1
        x = np.clip(turns.astype(np.int64) * n + rem, lo, hi - 1)
        return self.order[x % n]

    def keys(self, rng: np.random.Generator, src: np.ndarray) -> np.ndarray:
        """Undirected edge keys ``min*N + max`` (self-loops dropped) for edges from ``src``."""
        level = np.searchsorted(self.cum_q, rng.random(src.shape[0]), side="right")
        np.maximum(level, self.own_level[src], out=level)
        dst = np.empty_like(src)
        for lvl in np.unique(level):
            sel = np.flatnonzero(level == lvl)
            dst[sel] = self._window_ends(rng, src[sel], int(lvl))
        return _keys(src, dst, self.n)


def sorted_distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``a`` (sorts in place; numpy's hash-based unique is slower)."""
    a.sort()
    if a.shape[0] < 2:
        return a
    keep = np.empty(a.shape[0], dtype=np.bool_)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def surplus_positions(
    rng: np.random.Generator, total: int, extra: int, surplus: str
) -> Iterator[np.ndarray]:
    """Positions (among ``total`` sorted distinct keys) of the ``extra`` keys to drop.

    Yields ascending arrays of ascending positions (see :data:`SURPLUS` for the two methods).
    """
    if extra <= 0:
        return
    if surplus == "global":
        drop = rng.choice(total, size=extra, replace=False)
        drop.sort()
        yield drop
        return
    done = 0
    for start in range(0, total, SURPLUS_BLOCK):
        size = min(SURPLUS_BLOCK, total - start)
        upto = extra * (start + size) // total  # proportional share, exact in integers
        count, done = upto - done, upto
        if count:
            pos = rng.choice(size, size=count, replace=False)
            pos.sort()
            yield start + pos


class KeysInMemory:
    """The distinct keys drawn so far, held in memory (the store of :func:`generate`)."""

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.int64)
        self.parts: list[np.ndarray] = []

    def add(self, keys: np.ndarray) -> None:
        """Keep a chunk of drawn keys (duplicates allowed)."""
        self.parts.append(keys)

    def merge(self) -> int:
        """Drop duplicates among everything added; the number of distinct keys."""
        self.keys = sorted_distinct(np.concatenate([self.keys, *self.parts]))
        self.parts = []
        return int(self.keys.shape[0])

    def finish(self, drops: Iterator[np.ndarray]) -> np.ndarray:
        """The distinct keys without the positions ``drops`` yields."""
        keep = None
        for pos in drops:
            if keep is None:
                keep = np.ones(self.keys.shape[0], dtype=np.bool_)
            keep[pos] = False
        return self.keys if keep is None else self.keys[keep]


def draw_edges(
    rng: np.random.Generator,
    num_nodes: int,
    num_edges: int,
    sampler: UniformSampler | RingSampler,
    *,
    surplus: str = "global",
    store: object | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray | object:
    """Exactly ``num_edges`` distinct undirected edge keys ``min * N + max``, sorted.

    One edge starts from every node (so none is isolated), the rest from first ends the
    sampler draws; duplicates and self-loops are dropped and more edges drawn until enough are
    distinct, and a seeded random surplus is dropped at the end (:data:`SURPLUS`).

    Args:
        rng: the structure stream.
        num_nodes: number of nodes ``N``.
        num_edges: undirected edges wanted.
        sampler: where edges land.
        surplus: how the surplus is dropped, ``global`` or ``blocked``.
        store: where the keys go (``add``, ``merge``, ``finish``, as :class:`KeysInMemory`,
            the default); the same draws whatever the store, so the same edges.
        progress: called with the number of keys drawn after every chunk.

    Returns:
        int64 [num_edges] sorted keys (the store's ``finish``).

    Raises:
        ConfigError: when fifty rounds cannot place enough distinct edges.
    """
    n, m = num_nodes, num_edges
    store = KeysInMemory() if store is None else store
    have = 0
    first = True
    oversample = 1.05
    rounds = 0
    while have < m:
        rounds += 1
        if rounds > 50:
            raise ConfigError(f"cannot place {m} distinct edges; lower num_edges or p_local")
        need = int((m - have) * oversample) + 16
        drawn = 0
        if first:  # one edge from every node, so that no node is isolated
            for s in range(0, n, CHUNK):
                keys = sampler.keys(rng, np.arange(s, min(n, s + CHUNK)))
                drawn += keys.shape[0]
                store.add(keys)
                if progress is not None:
                    progress(keys.shape[0])
            need = max(0, need - n)
            first = False
        for s in range(0, need, CHUNK):
            src = sampler.sources(rng, min(CHUNK, need - s))
            keys = sampler.keys(rng, src)
            drawn += keys.shape[0]
            store.add(keys)
            if progress is not None:
                progress(keys.shape[0])
        before = have
        have = store.merge()
        gained = have - before
        oversample = min(4.0, max(1.05, 1.1 * drawn / max(gained, 1)))
        log.info("edges: round %d drew %d, %d distinct so far", rounds, drawn, have)
    return store.finish(surplus_positions(rng, have, have - m, surplus))
