"""Synthetic link-prediction datasets sized like OGB's: ``collab`` and ``citation2``.

Each preset is a graph of :func:`fullgraph.datasets.synthetic.generate` (the ``ring`` model of
a node preset, resized) split by :func:`fullgraph.datasets.link_split.split_edges` with the
held-out sizes and negatives of the OGB dataset it stands for:

========== ========== ============ ===== ================ ================== =========
preset     nodes      edges        feat. valid / test     negatives          metric
========== ========== ============ ===== ================ ================== =========
collab     235,868    1,285,465    128   60,084 / 46,329  100,000 pairs each hits@50
citation2  2,927,963  30,561,187   128   86,596 / 86,596  1,000 per edge     mrr
========== ========== ============ ===== ================ ================== =========

(ogbl-collab: 1,179,052 training edges; ogbl-citation2: 30,387,995.) ``scale`` multiplies the
node, edge, held-out and negative-pair counts (not K), so tests build small ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fullgraph.datasets.graph import Graph
from fullgraph.datasets.link import LinkSplit
from fullgraph.errors import ConfigError


@dataclass(frozen=True)
class LinkPreset:
    """Sizes of a synthetic link dataset (see the module table).

    Attributes:
        base: the node preset of :data:`fullgraph.datasets.synthetic.PRESETS` whose model it
            resizes.
        overrides: the :class:`~fullgraph.datasets.synthetic.SynthConfig` fields replaced.
        valid: held-out validation edges.
        test: held-out test edges.
        negatives: fixed negative pairs per evaluation split (0 with per-edge negatives).
        neg_per_edge: negative targets per held-out positive (0: pairs).
        metric: the split's metric.
    """

    base: str
    overrides: dict = field(default_factory=dict)
    valid: int = 0
    test: int = 0
    negatives: int = 0
    neg_per_edge: int = 0
    metric: str = ""


#: The presets of ``fullgraph data synth --preset collab|citation2``.
LINK_PRESETS = {
    "collab": LinkPreset(
        base="arxiv",
        overrides={"num_nodes": 235_868, "num_edges": 1_285_465, "num_features": 128},
        valid=60_084,
        test=46_329,
        negatives=100_000,
        metric="hits@50",
    ),
    "citation2": LinkPreset(
        base="products",
        overrides={"num_nodes": 2_927_963, "num_edges": 30_561_187, "num_features": 128},
        valid=86_596,
        test=86_596,
        neg_per_edge=1000,
        metric="mrr",
    ),
}


def _scaled(count: int, scale: float, least: int) -> int:
    return max(least, round(count * scale))


def link_preset_edges(preset: str, scale: float = 1.0) -> int:
    """The undirected edge count of ``preset`` at ``scale`` (for the memory check)."""
    return _scaled(LINK_PRESETS[preset].overrides["num_edges"], scale, 1)


def generate_link(
    preset: str,
    seed: int = 0,
    scale: float = 1.0,
    *,
    edge_weight: bool = False,
    edge_dim: int = 0,
    name: str = "",
) -> tuple[Graph, LinkSplit]:
    """The message-passing graph and split of a synthetic link preset.

    Args:
        preset: ``collab`` or ``citation2`` (:data:`LINK_PRESETS`).
        seed: seed of the graph and of the split.
        scale: multiplies nodes, edges, held-out edges and negative pairs (> 0).
        edge_weight: draw edge weights (:func:`~fullgraph.datasets.synthetic.with_edge_values`).
        edge_dim: draw edge feature rows of this width.
        name: the dataset's name (default ``<preset>-synth``).

    Returns:
        ``(graph, split)`` as :func:`~fullgraph.datasets.link_split.split_edges` returns them.

    Raises:
        ConfigError: unknown preset or a scale that leaves nothing to split.
    """
    from fullgraph.datasets.link_split import split_edges
    from fullgraph.datasets.synthetic import generate, with_edge_values

    if preset not in LINK_PRESETS:
        raise ConfigError(f"unknown link preset {preset!r}; known: {', '.join(LINK_PRESETS)}")
    if not scale > 0:
        raise ConfigError(f"--scale must be positive, got {scale}")
    p = LINK_PRESETS[preset]
    sizes = dict(p.overrides)
    sizes["num_nodes"] = _scaled(sizes["num_nodes"], scale, 2)
    sizes["num_edges"] = _scaled(sizes["num_edges"], scale, 1)
    graph = generate(p.base, seed=seed, **sizes)
    if edge_weight or edge_dim:
        graph = with_edge_values(graph, edge_weight=edge_weight, edge_dim=edge_dim, seed=seed)
    graph.meta = {
        "generator": "dcsbm",
        "link_preset": preset,
        "scale": scale,
        "seed": seed,
        "params": graph.meta["params"],
    }
    return split_edges(
        graph,
        val=_scaled(p.valid, scale, 1),
        test=_scaled(p.test, scale, 1),
        seed=seed,
        neg_per_edge=p.neg_per_edge,
        num_negatives=_scaled(p.negatives, scale, 1) if p.negatives else 0,
        metric=p.metric,
        name=name or f"{preset}-synth",
    )
