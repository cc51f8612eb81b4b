"""A seeded random link split of any undirected graph, in PyG ``RandomLinkSplit``'s conventions.

:func:`split_edges` takes a graph :func:`fullgraph.datasets.load` returns (symmetric, no
duplicates) and returns its message-passing graph and a checked
:class:`~fullgraph.datasets.link.LinkSplit`:

- every undirected edge is once in ``train``, ``valid`` or ``test`` (``--val`` / ``--test``: a
  fraction of the undirected edges, rounded down as PyG does, or a count), drawn by a seeded
  permutation; each is stored in a seeded random orientation (so that the sources, where a
  partition anchors an edge, spread over the parts);
- a held-out edge (valid, test) leaves the message-passing graph in both directions; the
  graph keeps every other entry with its edge values, node features and labels, and has no
  node split (masks all False);
- fixed negatives for valid and test are drawn, seeded, among the non-edges of the *whole*
  graph (no self-pair, none an edge of any split): ``neg_ratio`` distinct pairs per positive
  (or ``num_negatives`` pairs per split), or with ``neg_per_edge=K`` ogbl-citation2's layout,
  K negative targets for each positive's source (uniform, with replacement, never the source
  itself or one of its neighbours).

Memory stays a few arrays of the edge count: membership tests are binary searches in the
sorted edge keys, in chunks.
"""

from __future__ import annotations

import logging

import numpy as np

from fullgraph.datasets.edges import csr_to_edges
from fullgraph.datasets.graph import Graph
from fullgraph.datasets.link import LinkSplit, link_metric
from fullgraph.errors import ConfigError, DataError

log = logging.getLogger(__name__)

#: Entries handled per chunk in the membership tests.
CHUNK = 1 << 22
#: Rounds of redrawing rejected negatives before giving up (each keeps what it found).
MAX_ROUNDS = 200


def held_out_count(value: float, total: int, option: str) -> int:
    """The number of edges ``value`` asks for among ``total``: an int >= 1 is a count, a float
    in (0, 1) a fraction (rounded down, as PyG's ``RandomLinkSplit``).

    Raises:
        ConfigError: a fraction outside (0, 1), a count below 1, or no edge at all.
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        count = int(value)
    elif 0 < value < 1:
        count = int(value * total)
    else:
        raise ConfigError(f"{option} {value}: give a fraction in (0, 1) or a count of edges")
    if count < 1:
        raise ConfigError(
            f"{option} {value}: holds out no edge of {total:,}; give a larger fraction or a count"
        )
    return count


def member(sorted_keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Whether each of ``query`` is in ``sorted_keys`` (ascending int64), bool like ``query``."""
    if sorted_keys.size == 0:
        return np.zeros(query.shape, dtype=np.bool_)
    flat = query.reshape(-1)
    found = np.empty(flat.shape, dtype=np.bool_)
    for s in range(0, flat.size, CHUNK):
        order = np.argsort(flat[s : s + CHUNK])  # sorted queries: a cache-friendly search
        q = flat[s : s + CHUNK][order]
        at = np.minimum(np.searchsorted(sorted_keys, q), sorted_keys.size - 1)
        found[s : s + CHUNK][order] = sorted_keys[at] == q
    return found.reshape(query.shape)


def _keys(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    return np.minimum(a, b) * np.int64(n) + np.maximum(a, b)


def split_edges(
    graph: Graph,
    *,
    val: float = 0.05,
    test: float = 0.1,
    seed: int = 0,
    neg_ratio: float = 1.0,
    neg_per_edge: int = 0,
    num_negatives: int = 0,
    metric: str = "",
    name: str = "",
) -> tuple[Graph, LinkSplit]:
    """Split the undirected edges of ``graph`` into train / valid / test (see the module doc).

    Args:
        graph: a symmetric graph (as :func:`fullgraph.datasets.load` returns by default).
        val: held-out validation edges: a fraction of the undirected edges or a count.
        test: held-out test edges, likewise.
        seed: the seed of every draw; the same graph and arguments give the same split.
        neg_ratio: negative pairs per positive of valid and test (rounded, at least 1).
        neg_per_edge: K > 0: per-edge negative targets instead of pairs (ogbl-citation2).
        num_negatives: negative pairs per split instead of ``neg_ratio`` (0: by the ratio).
        metric: the split's metric (default ``auc`` for pairs, ``mrr`` per edge).
        name: the new dataset's name (default the graph's).

    Returns:
        ``(graph, split)``: the message-passing graph (training edges both ways) and the
        checked split.

    Raises:
        DataError: the graph is not undirected.
        ConfigError: impossible sizes (no edge held out or left for training, more negatives
            than non-edges, a source adjacent to every node).
    """
    name = name or graph.name
    n = graph.num_nodes
    src, dst = csr_to_edges(graph.indptr, graph.indices)
    up = np.flatnonzero(src < dst)  # each undirected edge once: its entry in row max(u, v)
    m = int(up.size)
    down = int(np.count_nonzero(src > dst))
    if down != m:
        raise DataError(
            f"{graph.name}: not an undirected graph ({m:,} entries u < v, {down:,} u > v); a "
            f"link split needs each edge both ways (load it symmetrised)"
        )
    n_val = held_out_count(val, m, "--val")
    n_test = held_out_count(test, m, "--test")
    if n_val + n_test >= m:
        raise ConfigError(
            f"--val {val} --test {test}: {n_val + n_test:,} held-out edges leave none of the "
            f"{m:,} undirected edges of {graph.name} for training; hold out fewer"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x11AC5]))
    u, v = src[up], dst[up]
    perm = rng.permutation(m)
    index = {
        "valid": np.sort(perm[:n_val]),
        "test": np.sort(perm[n_val : n_val + n_test]),
    }
    held = np.zeros(m, dtype=np.bool_)
    held[perm[: n_val + n_test]] = True
    del perm
    index["train"] = np.flatnonzero(~held)
    flip = rng.random(m, dtype=np.float32) < 0.5
    edges = {}
    for s in ("train", "valid", "test"):
        i = index[s]
        a, b = u[i], v[i]
        f = flip[i]
        edges[s] = np.stack([np.where(f, b, a), np.where(f, a, b)], axis=1)
        del a, b, f
    del flip
    weights = {}
    if graph.edge_weight is not None:
        w = np.asarray(graph.edge_weight)[up]
        weights = {s: w[i].astype(np.float32) for s, i in index.items()}
    del index
    whole = _keys(u, v, n)  # every edge of the graph, for the negatives
    held_keys = np.sort(whole[held])
    del u, v, held, up
    mp = _without(graph, src, dst, held_keys, name)
    del src, dst, held_keys
    whole.sort()
    per_edge = neg_per_edge > 0
    if per_edge:
        negatives = {
            s: _draw_targets(rng, edges[s][:, 0], neg_per_edge, n, whole, graph)
            for s in ("valid", "test")
        }
    else:
        counts = {
            s: num_negatives or max(1, round(neg_ratio * len(edges[s]))) for s in ("valid", "test")
        }
        pairs = _draw_pairs(rng, n, counts["valid"] + counts["test"], whole)
        negatives = {"valid": pairs[: counts["valid"]], "test": pairs[counts["valid"] :]}
    del whole
    split = LinkSplit(
        name=name,
        num_nodes=n,
        edges=edges,
        negatives=negatives,
        per_edge_negatives=per_edge,
        undirected=True,
        metric=metric or link_metric(name, per_edge),
        edge_weight=weights,
    )
    log.info(
        "%s: %d train / %d valid / %d test edges, negatives %s",
        name,
        len(edges["train"]),
        n_val,
        n_test,
        {s: list(a.shape) for s, a in negatives.items()},
    )
    return mp, split.check(where=name)


def _without(
    graph: Graph, src: np.ndarray, dst: np.ndarray, held_keys: np.ndarray, name: str
) -> Graph:
    """``graph`` without the entries of held-out edges (both directions), node split empty."""
    drop = np.empty(src.shape, dtype=np.bool_)
    n = graph.num_nodes
    for s in range(0, src.size, CHUNK):
        drop[s : s + CHUNK] = member(held_keys, _keys(src[s : s + CHUNK], dst[s : s + CHUNK], n))
    keep = ~drop
    del drop
    before = np.zeros(keep.size + 1, dtype=np.int64)
    np.cumsum(keep, out=before[1:])
    indptr = before[graph.indptr]
    del before
    values = {
        k: None if getattr(graph, k) is None else np.asarray(getattr(graph, k))[keep]
        for k in ("edge_weight", "edge_attr")
    }
    none = np.zeros(n, dtype=np.bool_)
    meta = {k: v for k, v in graph.meta.items() if k not in ("path", "format")}
    return Graph(
        name=name,
        num_nodes=n,
        indptr=indptr,
        indices=np.asarray(graph.indices)[keep],
        x=graph.x,
        y=graph.y,
        train_mask=none,
        val_mask=none.copy(),
        test_mask=none.copy(),
        num_classes=graph.num_classes,
        meta=meta,
        **values,
    ).validate()


def _draw_pairs(rng: np.random.Generator, n: int, total: int, whole: np.ndarray) -> np.ndarray:
    """``total`` distinct non-edge pairs (no self-pair), uniform, in the order drawn."""
    free = n * (n - 1) // 2 - whole.size
    if total > free:
        raise ConfigError(
            f"{total:,} negative pairs asked but the graph has only {free:,} non-edges; ask "
            f"for fewer (--neg-ratio)"
        )
    found = np.zeros((0, 2), dtype=np.int64)
    for _ in range(MAX_ROUNDS):
        need = total - len(found)
        if need <= 0:
            break
        k = need + need // 4 + 64
        a, b = rng.integers(0, n, k, dtype=np.int64), rng.integers(0, n, k, dtype=np.int64)
        ok = (a != b) & ~member(whole, _keys(a, b, n))
        found = np.concatenate([found, np.stack([a[ok], b[ok]], axis=1)])
        _, first = np.unique(_keys(found[:, 0], found[:, 1], n), return_index=True)
        found = found[np.sort(first)][:total]
    if len(found) < total:
        raise ConfigError(
            f"drew only {len(found):,} of {total:,} distinct negative pairs in {MAX_ROUNDS} "
            f"rounds (the graph is nearly complete); ask for fewer (--neg-ratio)"
        )
    return found


def _draw_targets(
    rng: np.random.Generator,
    sources: np.ndarray,
    k: int,
    n: int,
    whole: np.ndarray,
    graph: Graph,
) -> np.ndarray:
    """``k`` negative targets per source: uniform nodes, never the source nor a neighbour."""
    degree = np.diff(graph.indptr)[sources]
    if sources.size and int(degree.max()) >= n - 1:
        v = int(sources[np.argmax(degree)])
        raise ConfigError(
            f"node {v} is adjacent to every other node: it has no negative target to draw; "
            f"use negative pairs (--neg-ratio) instead of --neg-per-edge"
        )
    targets = rng.integers(0, n, (sources.size, k), dtype=np.int64)
    rows = max(1, CHUNK // k)
    bad = []  # flat positions of rejected targets, first over every row, then only those
    for r in range(0, sources.size, rows):
        s, t = sources[r : r + rows, None], targets[r : r + rows]
        hit = (s == t) | member(whole, _keys(s, t, n))
        bad.append(r * k + np.flatnonzero(hit))
    pending = np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)
    flat = targets.reshape(-1)
    for _ in range(MAX_ROUNDS):
        if pending.size == 0:
            return targets
        flat[pending] = rng.integers(0, n, pending.size, dtype=np.int64)
        s, t = sources[pending // k], flat[pending]
        pending = pending[(s == t) | member(whole, _keys(s, t, n))]
    if pending.size == 0:
        return targets
    raise ConfigError(
        f"{pending.size:,} negative targets still hit a neighbour after {MAX_ROUNDS} rounds; "
        f"use fewer --neg-per-edge"
    )
