"""Synthetic node-classification graphs: a degree-corrected stochastic block model.

Model (all vectorised numpy, generated in fixed-size chunks, deterministic from the seed):

- Nodes fall into ``B`` communities ("blocks", about ``block_size`` nodes each, sizes vary).
  Each block has a dominant class; a node carries its block's class with probability
  ``label_purity``, otherwise a class drawn from the (imbalanced, Zipf-like) class prior.
- Every node has a power-law propensity ``theta`` (Pareto, exponent ``degree_exponent``, capped
  below the block size). An edge picks its first end proportional to ``theta`` (plus one edge
  started from every node, so none is isolated), and its second end proportional to ``theta``
  inside the same block with probability ``p_local``, else anywhere in the graph. Self-loops and
  duplicates are dropped and more edges drawn until exactly ``num_edges`` undirected edges exist.
- Features are a class centroid times ``signal`` plus unit Gaussian noise, rounded to three
  decimals (so they survive the CSV round trip exactly): noisy enough that a feature-only MLP is
  mediocre while a GCN, averaging a mostly same-class neighbourhood, does much better.
- Train/validation/test masks are a seeded random split with the preset's fractions.

Locality (blocks) and label homophily are separate knobs, as in real graphs: METIS finds the
blocks; label purity sets how much the neighbourhood tells about a node's class.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace

import numpy as np

from fullgraph.datasets.edges import edges_to_csr
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.errors import ConfigError

__all__ = ["PRESETS", "SynthConfig", "generate", "write_ogb"]

log = logging.getLogger(__name__)

#: Edges drawn per chunk; fixed so that outputs do not depend on memory.
_CHUNK = 4_000_000


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of :func:`generate`; presets fill them, keyword overrides replace them."""

    num_nodes: int
    num_edges: int  # undirected, distinct, no self-loops
    num_features: int
    num_classes: int
    train_frac: float
    val_frac: float
    block_size: int = 400
    p_local: float = 0.9
    label_purity: float = 0.8
    degree_exponent: float = 2.5
    class_skew: float = 0.7
    signal: float = 0.35


#: Named sizes: ``tiny`` for tests and the demo, ``arxiv`` and ``products`` like OGB's graphs.
PRESETS: dict[str, SynthConfig] = {
    "tiny": SynthConfig(
        num_nodes=3000,
        num_edges=15_000,
        num_features=32,
        num_classes=6,
        train_frac=0.3,
        val_frac=0.2,
        block_size=60,
        signal=0.2,
    ),
    "arxiv": SynthConfig(
        num_nodes=169_343,
        num_edges=1_166_243,
        num_features=128,
        num_classes=40,
        train_frac=0.54,
        val_frac=0.18,
        block_size=400,
        signal=0.2,
    ),
    "products": SynthConfig(
        num_nodes=2_449_029,
        num_edges=61_859_140,
        num_features=100,
        num_classes=47,
        train_frac=0.08,
        val_frac=0.016,
        block_size=1000,
        signal=0.21,
    ),
}


def _config(preset: str, overrides: dict) -> SynthConfig:
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    fields = set(SynthConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"unknown synthetic parameter(s) {unknown}; known: {sorted(fields)}")
    cfg = replace(PRESETS[preset], **overrides)
    n = cfg.num_nodes
    if n < 2 or cfg.num_classes < 1 or cfg.num_features < 1 or cfg.block_size < 2:
        raise ConfigError(f"synthetic graph needs >= 2 nodes, classes/features/blocks >= 1: {cfg}")
    if not 0 < cfg.num_edges <= n * (n - 1) // 4:
        raise ConfigError(f"num_edges {cfg.num_edges} must be in (0, {n * (n - 1) // 4}]")
    if cfg.train_frac <= 0 or cfg.val_frac < 0 or cfg.train_frac + cfg.val_frac >= 1:
        raise ConfigError("need train_frac > 0, val_frac >= 0 and train_frac + val_frac < 1")
    return cfg


def _propensities(rng: np.random.Generator, cfg: SynthConfig) -> np.ndarray:
    """Pareto propensities, capped so that a hub's expected degree stays below its block."""
    a = cfg.degree_exponent - 1.0
    theta = (1.0 - rng.random(cfg.num_nodes)) ** (-1.0 / a)
    mean_deg = 2.0 * cfg.num_edges / cfg.num_nodes
    cap = max(2.0, 0.5 * cfg.block_size / mean_deg * theta.mean())
    return np.minimum(theta, cap)


class _EdgeSampler:
    """Draws DC-SBM edges in chunks: ends proportional to theta, globally or within a block."""

    def __init__(self, theta: np.ndarray, block: np.ndarray, num_blocks: int) -> None:
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

    def global_ends(self, rng: np.random.Generator, k: int) -> np.ndarray:
        u = rng.random(k) * self.cum[-1]
        return np.minimum(np.searchsorted(self.cum, u, side="right"), self.cum.shape[0] - 1)

    def local_ends(self, rng: np.random.Generator, src: np.ndarray) -> np.ndarray:
        b = self.block[src]
        u = self.w_begin[b] + rng.random(src.shape[0]) * (self.w_end[b] - self.w_begin[b])
        pos = np.searchsorted(self.cum_block, u, side="right")
        pos = np.clip(pos, self.begin[b], self.end[b] - 1)
        return self.order[pos]

    def keys(self, rng: np.random.Generator, src: np.ndarray, p_local: float) -> np.ndarray:
        """Undirected edge keys ``min*N + max`` (self-loops dropped) for edges from ``src``."""
        local = rng.random(src.shape[0]) < p_local
        dst = np.empty_like(src)
        dst[local] = self.local_ends(rng, src[local])
        dst[~local] = self.global_ends(rng, int((~local).sum()))
        keep = src != dst
        lo = np.minimum(src[keep], dst[keep])
        hi = np.maximum(src[keep], dst[keep])
        return lo * np.int64(self.cum.shape[0]) + hi


def _sorted_distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``a`` (sorts in place; numpy's hash-based unique is slower)."""
    a.sort()
    if a.shape[0] < 2:
        return a
    keep = np.empty(a.shape[0], dtype=np.bool_)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _edges(rng: np.random.Generator, cfg: SynthConfig, sampler: _EdgeSampler) -> np.ndarray:
    """Exactly ``num_edges`` distinct undirected keys, sorted."""
    n, m = cfg.num_nodes, cfg.num_edges
    keys = np.empty(0, dtype=np.int64)
    first = True
    oversample = 1.05
    rounds = 0
    while keys.shape[0] < m:
        rounds += 1
        if rounds > 50:
            raise ConfigError(f"cannot place {m} distinct edges; lower num_edges or p_local")
        need = int((m - keys.shape[0]) * oversample) + 16
        parts = [keys]
        if first:  # one edge from every node, so that no node is isolated
            for s in range(0, n, _CHUNK):
                parts.append(sampler.keys(rng, np.arange(s, min(n, s + _CHUNK)), cfg.p_local))
            need = max(0, need - n)
            first = False
        for s in range(0, need, _CHUNK):
            src = sampler.global_ends(rng, min(_CHUNK, need - s))
            parts.append(sampler.keys(rng, src, cfg.p_local))
        drawn = sum(p.shape[0] for p in parts) - keys.shape[0]
        before = keys.shape[0]
        keys = _sorted_distinct(np.concatenate(parts))
        del parts
        gained = keys.shape[0] - before
        oversample = min(4.0, max(1.05, 1.1 * drawn / max(gained, 1)))
        log.info("edges: round %d drew %d, %d distinct so far", rounds, drawn, keys.shape[0])
    extra = keys.shape[0] - m
    if extra:
        drop = rng.choice(keys.shape[0], size=extra, replace=False)
        keep = np.ones(keys.shape[0], dtype=np.bool_)
        keep[drop] = False
        keys = keys[keep]
    return keys


def _features(rng: np.random.Generator, cfg: SynthConfig, y: np.ndarray) -> np.ndarray:
    centroids = rng.standard_normal((cfg.num_classes, cfg.num_features), dtype=np.float32)
    centroids *= np.float32(cfg.signal)
    x = np.empty((cfg.num_nodes, cfg.num_features), dtype=np.float32)
    rows = max(1, _CHUNK // cfg.num_features)
    for s in range(0, cfg.num_nodes, rows):
        e = min(cfg.num_nodes, s + rows)
        block = rng.standard_normal((e - s, cfg.num_features), dtype=np.float32)
        block += centroids[y[s:e]]
        x[s:e] = np.round(block, 3)
    return x


def generate(preset: str = "tiny", seed: int = 0, **overrides: float) -> Graph:
    """Generate a synthetic graph (symmetric, no self-loops or duplicates).

    Args:
        preset: ``tiny``, ``arxiv`` or ``products`` (see :data:`PRESETS`).
        seed: random seed; the same preset, seed and overrides give identical graphs.
        **overrides: fields of :class:`SynthConfig` to replace (``num_nodes=...`` etc.).

    Returns:
        The graph, named ``synth-<preset>``; ``meta`` records the generator parameters.

    Raises:
        ConfigError: unknown preset or parameter, or impossible sizes.
    """
    cfg = _config(preset, dict(overrides))
    ss = np.random.SeedSequence([seed, 0x5EED])
    rng_struct, rng_label, rng_feat, rng_split = (np.random.default_rng(s) for s in ss.spawn(4))
    n, k = cfg.num_nodes, cfg.num_classes

    prior = 1.0 / np.arange(1, k + 1) ** cfg.class_skew
    prior /= prior.sum()
    num_blocks = max(1, round(n / cfg.block_size))
    block_w = rng_label.gamma(2.0, size=num_blocks)
    block = rng_label.choice(num_blocks, size=n, p=block_w / block_w.sum())
    block_class = rng_label.choice(k, size=num_blocks, p=prior)
    y = block_class[block]
    other = rng_label.random(n) >= cfg.label_purity
    y[other] = rng_label.choice(k, size=int(other.sum()), p=prior)
    y = y.astype(np.int64)

    theta = _propensities(rng_struct, cfg)
    sampler = _EdgeSampler(theta, block, num_blocks)
    keys = _edges(rng_struct, cfg, sampler)
    del sampler, theta
    lo, hi = np.divmod(keys, np.int64(n))
    del keys
    indptr, indices = edges_to_csr(lo, hi, n, symmetric=True, what=f"synth-{preset}")
    del lo, hi

    x = _features(rng_feat, cfg, y)
    perm = rng_split.permutation(n)
    n_train = int(round(cfg.train_frac * n))
    n_val = int(round(cfg.val_frac * n))
    masks = []
    for part in (perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]):
        m = np.zeros(n, dtype=np.bool_)
        m[part] = True
        masks.append(m)
    meta = {"generator": "dcsbm", "preset": preset, "seed": seed, "params": asdict(cfg)}
    graph = Graph(
        name=f"synth-{preset}",
        num_nodes=n,
        indptr=indptr,
        indices=indices,
        x=x,
        y=y,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=k,
        meta=meta,
    )
    return graph.validate()
