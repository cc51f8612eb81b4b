"""Synthetic node-classification graphs: degree-corrected stochastic block models.

Model (all vectorised numpy, generated in fixed-size chunks, deterministic from the seed):

- Nodes fall into ``B`` communities ("blocks", about ``block_size`` nodes each, sizes vary).
  Each block has a dominant class; a node carries its block's class with probability
  ``label_purity``, otherwise a class drawn from the (imbalanced, Zipf-like) class prior. With
  ``topic_span > 1`` runs of that many consecutive blocks share their dominant class (a topic).
- Edges: an edge stays inside a community with probability ``p_local``; where the others go is
  the ``locality`` model, see :mod:`fullgraph.datasets.synthetic_edges`:

  * ``"ring"`` (presets ``arxiv``, ``products``): communities sit on a ring and a
    cross-community edge reaches a window around its first end whose width doubles with each
    reach level (level ``L`` has probability ``~ reach_decay ** L``), so most go to nearby
    communities, a few across the graph. First ends are drawn by popularity (power law with
    exponent ``degree_exponent``, capped at ``max_degree``; popular nodes reach wider windows),
    second ends by activity (popularity ``** activity_power``, light-tailed). METIS halos come out
    like those of the real OGB graphs (``docs/datasets.md``).
  * ``"uniform"`` (presets ``tiny``, ``arxiv-stress``, ``products-stress``; the generator of
    earlier versions, unchanged bit for bit): both ends by Pareto propensity, capped below half
    a community, and a cross-community edge goes to any node of the graph. Every cut edge is a
    random long-range edge: a worst case for halo exchange (about 4x the real halo volume on
    products at P = 4).

  Self-loops and duplicates are dropped and more edges drawn until exactly ``num_edges``
  undirected edges exist; one edge starts from every node, so none is isolated.
- Features are a class centroid times ``signal`` plus unit Gaussian noise, rounded to three
  decimals (so they survive the CSV round trip exactly): noisy enough that a feature-only MLP is
  mediocre while a GCN, averaging a mostly same-class neighbourhood, does much better.
- Train/validation/test masks are a seeded random split with the preset's fractions.

Locality (blocks, reach) and label homophily are separate knobs, as in real graphs: METIS finds
the blocks; label purity and topics set how much the neighbourhood tells about a node's class.
Structure, labels, features and split use separate random streams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import numpy as np

from fullgraph.datasets.edges import csr_to_edges, edges_to_csr
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.ogb_writer import write_ogb
from fullgraph.datasets.synthetic_edges import (
    CHUNK,
    SURPLUS,
    RingSampler,
    UniformSampler,
    draw_edges,
    power_law,
)
from fullgraph.errors import ConfigError

__all__ = ["LOCALITIES", "PRESETS", "SynthConfig", "generate", "resolve", "scaled", "write_ogb"]

#: Models of where cross-community edges go (``SynthConfig.locality``).
LOCALITIES = ("ring", "uniform")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of :func:`generate`; presets fill them, keyword overrides replace them.

    The fields from ``locality`` on apply to the ``"ring"`` model only (``topic_span`` to both).
    """

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
    locality: str = "uniform"  # "uniform" (stress) or "ring"
    reach_decay: float = 1.0  # P(reach level L + 1) / P(level L)
    max_degree: int = 0  # cap of expected popularity (0: none)
    activity_power: float = 0.5  # second ends ~ popularity ** activity_power
    topic_span: int = 1  # consecutive blocks sharing a dominant class
    test_frac: float = -1.0  # share of nodes in the test split (< 0: every other labelled node)
    labelled_frac: float = 1.0  # share of nodes with a label; the others get y = -1
    labelled_topics: float = 1.0  # share of topics (runs of topic_span blocks) they lie in
    surplus: str = "global"  # how the surplus edges are dropped: "global" or "blocked"


_ARXIV = {
    "num_nodes": 169_343,
    "num_edges": 1_166_243,
    "num_features": 128,
    "num_classes": 40,
    "train_frac": 0.54,
    "val_frac": 0.18,
}
_PRODUCTS = {
    "num_nodes": 2_449_029,
    "num_edges": 61_859_140,
    "num_features": 100,
    "num_classes": 47,
    "train_frac": 0.08,
    "val_frac": 0.016,
}

#: ogbn-papers100M's published sizes: nodes, directed citations (each one undirected edge
#: here), and its 1,546,782 labelled nodes (the arXiv papers) split 1,207,179 / 125,265 / 214,338.
_PAPERS_NODES = 111_059_956
_PAPERS = {
    "num_nodes": _PAPERS_NODES,
    "num_edges": 1_615_685_872,
    "num_features": 128,
    "num_classes": 172,
    "train_frac": 1_207_179 / _PAPERS_NODES,
    "val_frac": 125_265 / _PAPERS_NODES,
    "test_frac": 214_338 / _PAPERS_NODES,
    "labelled_frac": 1_546_782 / _PAPERS_NODES,
}

#: Named sizes: ``tiny`` for tests and the demo, ``arxiv`` and ``products`` like OGB's graphs
#: (their METIS halo volume too), ``*-stress`` the same sizes with random long-range edges,
#: ``papers`` like ogbn-papers100M (arxiv's citation model, 1.4% labelled in 2% of the topics).
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
        **_ARXIV,
        block_size=400,
        signal=0.2,
        locality="ring",
        p_local=0.45,
        reach_decay=0.85,
        degree_exponent=2.3,
        max_degree=16_000,
        topic_span=8,
    ),
    "products": SynthConfig(
        **_PRODUCTS,
        block_size=1000,
        signal=0.21,
        locality="ring",
        p_local=0.83,
        reach_decay=0.85,
        degree_exponent=2.3,
        max_degree=19_000,
        topic_span=8,
    ),
    "papers": SynthConfig(
        **_PAPERS,
        block_size=400,
        signal=0.2,
        locality="ring",
        p_local=0.45,
        reach_decay=0.85,
        degree_exponent=2.3,
        max_degree=250_000,
        topic_span=8,
        labelled_topics=0.02,
        surplus="blocked",
    ),
    "arxiv-stress": SynthConfig(**_ARXIV, block_size=400, signal=0.2),
    "products-stress": SynthConfig(**_PRODUCTS, block_size=1000, signal=0.21),
}


def scaled(cfg: SynthConfig, scale: float) -> SynthConfig:
    """``cfg`` with ``scale`` times its nodes and edges (fractions kept) and its degree cap times
    ``scale ** (1 / (degree_exponent - 1))``, as the largest of N power-law draws grows.

    Raises:
        ConfigError: ``scale`` not in (0, 1].
    """
    if not 0 < scale <= 1:
        raise ConfigError(f"--scale must be in (0, 1], got {scale}")
    if scale == 1:
        return cfg
    cap = cfg.max_degree * scale ** (1.0 / (cfg.degree_exponent - 1.0)) if cfg.max_degree else 0
    return replace(
        cfg,
        num_nodes=max(2, round(cfg.num_nodes * scale)),
        num_edges=max(1, round(cfg.num_edges * scale)),
        max_degree=max(0, round(cap)),
    )


def resolve(preset: str, overrides: dict | None = None, scale: float = 1.0) -> SynthConfig:
    """The checked configuration of ``preset`` at ``scale`` with ``overrides`` applied.

    Raises:
        ConfigError: unknown preset or parameter, or impossible sizes and fractions.
    """
    return _config(preset, dict(overrides or {}), scale)


def _config(preset: str, overrides: dict, scale: float = 1.0) -> SynthConfig:
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    fields = set(SynthConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"unknown synthetic parameter(s) {unknown}; known: {sorted(fields)}")
    cfg = replace(scaled(PRESETS[preset], scale), **overrides)
    n = cfg.num_nodes
    if n < 2 or cfg.num_classes < 1 or cfg.num_features < 1 or cfg.block_size < 2:
        raise ConfigError(f"synthetic graph needs >= 2 nodes, classes/features/blocks >= 1: {cfg}")
    if not 0 < cfg.num_edges <= n * (n - 1) // 4:
        raise ConfigError(f"num_edges {cfg.num_edges} must be in (0, {n * (n - 1) // 4}]")
    if cfg.train_frac <= 0 or cfg.val_frac < 0 or cfg.train_frac + cfg.val_frac >= 1:
        raise ConfigError("need train_frac > 0, val_frac >= 0 and train_frac + val_frac < 1")
    if cfg.locality not in LOCALITIES:
        raise ConfigError(f"unknown locality {cfg.locality!r}; known: {', '.join(LOCALITIES)}")
    if not (0 <= cfg.p_local <= 1 and cfg.degree_exponent > 1 and cfg.reach_decay > 0):
        raise ConfigError("need 0 <= p_local <= 1, degree_exponent > 1 and reach_decay > 0")
    if cfg.max_degree < 0 or cfg.activity_power < 0 or cfg.topic_span < 1:
        raise ConfigError("need max_degree >= 0, activity_power >= 0 and topic_span >= 1")
    if not (0 < cfg.labelled_frac <= 1 and 0 < cfg.labelled_topics <= 1):
        raise ConfigError("need 0 < labelled_frac <= 1 and 0 < labelled_topics <= 1")
    split = cfg.train_frac + cfg.val_frac + max(cfg.test_frac, 0.0)
    if split > cfg.labelled_frac * (1 + 1e-9):
        raise ConfigError(
            f"train_frac + val_frac + test_frac = {split:g} exceeds labelled_frac "
            f"{cfg.labelled_frac:g}: only labelled nodes are in a split"
        )
    if cfg.surplus not in SURPLUS:
        raise ConfigError(f"unknown surplus {cfg.surplus!r}; known: {', '.join(SURPLUS)}")
    return cfg


def _legacy_propensities(rng: np.random.Generator, cfg: SynthConfig) -> np.ndarray:
    """Pareto propensities, capped so that a hub's expected degree stays below its block."""
    a = cfg.degree_exponent - 1.0
    theta = (1.0 - rng.random(cfg.num_nodes)) ** (-1.0 / a)
    mean_deg = 2.0 * cfg.num_edges / cfg.num_nodes
    cap = max(2.0, 0.5 * cfg.block_size / mean_deg * theta.mean())
    return np.minimum(theta, cap)


def edge_sampler(
    rng: np.random.Generator, cfg: SynthConfig, block: np.ndarray, num_blocks: int
) -> UniformSampler | RingSampler:
    """The edge sampler of ``cfg.locality``, with the node weights it needs (drawn from the
    structure stream ``rng``)."""
    if cfg.locality == "uniform":
        return UniformSampler(_legacy_propensities(rng, cfg), block, num_blocks, cfg.p_local)
    mean = cfg.num_edges / cfg.num_nodes  # edges of which a node is the first end
    popularity = power_law(rng, cfg.num_nodes, mean, cfg.degree_exponent, cfg.max_degree)
    activity = popularity**cfg.activity_power
    return RingSampler(popularity, activity, block, num_blocks, cfg.p_local, cfg.reach_decay)


def feature_blocks(
    rng: np.random.Generator, cfg: SynthConfig, y: np.ndarray
) -> Iterator[tuple[int, np.ndarray]]:
    """The feature rows in consecutive blocks ``(first row, float32 block)``, drawn in the
    same order whoever consumes them (so a chunked writer and :func:`generate` agree)."""
    centroids = rng.standard_normal((cfg.num_classes, cfg.num_features), dtype=np.float32)
    centroids *= np.float32(cfg.signal)
    rows = max(1, CHUNK // cfg.num_features)
    for s in range(0, cfg.num_nodes, rows):
        e = min(cfg.num_nodes, s + rows)
        block = rng.standard_normal((e - s, cfg.num_features), dtype=np.float32)
        block += centroids[y[s:e]]
        yield s, np.round(block, 3)


def _features(rng: np.random.Generator, cfg: SynthConfig, y: np.ndarray) -> np.ndarray:
    x = np.empty((cfg.num_nodes, cfg.num_features), dtype=np.float32)
    for s, block in feature_blocks(rng, cfg, y):
        x[s : s + block.shape[0]] = block
    return x


def streams(seed: int) -> tuple[np.random.Generator, ...]:
    """The structure, label, feature and split streams of ``seed`` (in that order)."""
    ss = np.random.SeedSequence([seed, 0x5EED])
    return tuple(np.random.default_rng(s) for s in ss.spawn(4))


def communities(rng: np.random.Generator, cfg: SynthConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """``(latent class of every node, its community, number of communities)``."""
    n, k = cfg.num_nodes, cfg.num_classes
    prior = 1.0 / np.arange(1, k + 1) ** cfg.class_skew
    prior /= prior.sum()
    num_blocks = max(1, round(n / cfg.block_size))
    block_w = rng.gamma(2.0, size=num_blocks)
    block = rng.choice(num_blocks, size=n, p=block_w / block_w.sum())
    if cfg.topic_span > 1:
        topic = rng.choice(k, size=-(-num_blocks // cfg.topic_span), p=prior)
        block_class = topic[np.arange(num_blocks) // cfg.topic_span]
    else:
        block_class = rng.choice(k, size=num_blocks, p=prior)
    y = block_class[block]
    other = rng.random(n) >= cfg.label_purity
    y[other] = rng.choice(k, size=int(other.sum()), p=prior)
    return y.astype(np.int64), block, num_blocks


def labelled_nodes(cfg: SynthConfig, seed: int, block: np.ndarray) -> np.ndarray | None:
    """The labelled nodes, ascending (``None``: every node, ``labelled_frac = 1``).

    They lie in a seeded ``labelled_topics`` share of the topics (runs of ``topic_span``
    neighbouring communities), so they cite each other far more than a random sample would:
    papers100M's labelled nodes are its arXiv papers. Where those topics hold too few nodes,
    the rest are drawn from the other nodes.
    """
    if cfg.labelled_frac >= 1:
        return None
    n = cfg.num_nodes
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1ABE1]))
    want = max(1, round(cfg.labelled_frac * n))
    topic = block // cfg.topic_span
    topics = int(topic.max()) + 1
    chosen = np.zeros(topics, dtype=np.bool_)
    chosen[rng.choice(topics, size=max(1, round(cfg.labelled_topics * topics)), replace=False)] = (
        True
    )
    inside = np.flatnonzero(chosen[topic])
    if inside.size >= want:
        picked = rng.choice(inside, size=want, replace=False)
    else:
        outside = np.flatnonzero(~chosen[topic])
        picked = np.concatenate(
            [inside, rng.choice(outside, size=want - inside.size, replace=False)]
        )
    picked.sort()
    return picked


def split_masks(
    cfg: SynthConfig, rng: np.random.Generator, labelled: np.ndarray | None
) -> list[np.ndarray]:
    """Train, validation and test masks: a seeded random split of the labelled nodes."""
    n = cfg.num_nodes
    perm = rng.permutation(n) if labelled is None else rng.permutation(labelled)
    n_train = int(round(cfg.train_frac * n))
    n_val = int(round(cfg.val_frac * n))
    end = perm.shape[0] if cfg.test_frac < 0 else n_train + n_val + int(round(cfg.test_frac * n))
    masks = []
    for part in (perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val : end]):
        m = np.zeros(n, dtype=np.bool_)
        m[part] = True
        masks.append(m)
    return masks


def generate(preset: str = "tiny", seed: int = 0, scale: float = 1.0, **overrides: float) -> Graph:
    """Generate a synthetic graph (symmetric, no self-loops or duplicates).

    Args:
        preset: ``tiny``, ``arxiv``, ``products``, ``papers``, ``arxiv-stress`` or
            ``products-stress`` (see :data:`PRESETS`).
        seed: random seed; the same preset, seed and overrides give identical graphs.
        scale: multiply the preset's nodes and edges by this (see :func:`scaled`).
        **overrides: fields of :class:`SynthConfig` to replace (``num_nodes=...`` etc.).

    Returns:
        The graph, named ``synth-<preset>``; ``meta`` records the generator parameters.

    Raises:
        ConfigError: unknown preset or parameter, or impossible sizes.
    """
    cfg = _config(preset, dict(overrides), scale)
    rng_struct, rng_label, rng_feat, rng_split = streams(seed)
    n = cfg.num_nodes
    y, block, num_blocks = communities(rng_label, cfg)
    sampler = edge_sampler(rng_struct, cfg, block, num_blocks)
    keys = draw_edges(rng_struct, n, cfg.num_edges, sampler, surplus=cfg.surplus)
    del sampler
    lo, hi = np.divmod(keys, np.int64(n))
    del keys
    indptr, indices = edges_to_csr(lo, hi, n, symmetric=True, what=f"synth-{preset}")
    del lo, hi

    x = _features(rng_feat, cfg, y)
    labelled = labelled_nodes(cfg, seed, block)
    masks = split_masks(cfg, rng_split, labelled)
    if labelled is not None:
        known = np.zeros(n, dtype=np.bool_)
        known[labelled] = True
        y[~known] = -1
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
        num_classes=cfg.num_classes,
        meta=meta,
    )
    return graph.validate()


#: Bytes per (undirected edge x edge feature) while :func:`with_edge_values` draws the rows:
#: the float64 draw (8), both directions of it in float64 (16) and in float32 (8).
EDGE_FEATURE_DRAW_BYTES = 32


def edge_values_bytes(preset: str, edge_dim: int, edge_weight: bool) -> int:
    """The peak bytes :func:`with_edge_values` takes for ``preset``'s graph (its edge count is
    the preset's, known before anything is generated), for the check before ``data synth``."""
    edges = _config(preset, {}).num_edges
    return edges * (EDGE_FEATURE_DRAW_BYTES * int(edge_dim) + (32 if edge_weight else 0))


def with_edge_values(
    graph: Graph, *, edge_weight: bool = True, edge_dim: int = 0, seed: int = 0
) -> Graph:
    """``graph`` with drawn per-edge weights and / or feature rows (for tests and benches).

    Both directions of an edge get the same values (drawn once per node pair), so a symmetric
    graph stays symmetric with its values and is written once per undirected edge.

    Args:
        graph: the graph (not modified).
        edge_weight: draw ``edge_weight``, uniform in ``[0.5, 2]`` on a 1/64 grid.
        edge_dim: width of the drawn ``edge_attr`` rows (0: none), normal rounded to 1/64.
        seed: random seed.

    Returns:
        A new graph sharing every other array with ``graph``.
    """
    src, dst = csr_to_edges(graph.indptr, graph.indices)
    n = np.int64(graph.num_nodes)
    pairs, which = np.unique(np.minimum(src, dst) * n + np.maximum(src, dst), return_inverse=True)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xED6E]))
    weight = np.round(rng.uniform(0.5, 2.0, pairs.size) * 64) / 64 if edge_weight else None
    attr = np.round(rng.normal(size=(pairs.size, edge_dim)) * 64) / 64 if edge_dim else None
    return replace(
        graph,
        edge_weight=None if weight is None else weight[which].astype(np.float32),
        edge_attr=None if attr is None else attr[which].astype(np.float32),
    ).validate()
