"""The supervision edges of a link-prediction dataset: :class:`LinkSplit`.

A link-prediction dataset is a message-passing graph (a :class:`~fullgraph.datasets.graph.
Graph` holding the training edges only) plus held-out edges to score. :class:`LinkSplit` holds
the latter in global node ids, in OGB's linkprop conventions:

- ``edges[s]`` for ``s`` in ``train``, ``valid``, ``test``: int64 ``[E_s, 2]`` positive pairs
  ``(source, target)``; an undirected edge appears once;
- ``negatives[s]`` for ``valid`` and ``test``: either fixed negative pairs int64 ``[N_s, 2]``
  (ogbl-collab, -ppa, -ddi's ``edge_neg``; the GAE protocol's sampled non-edges), or, with
  ``per_edge_negatives``, int64 ``[E_s, K]`` negative *targets* of each positive's source
  (ogbl-citation2's ``target_node_neg``: the positive ranks among its own K negatives);
- ``metric``: what the split is scored by (:data:`LINK_METRICS`): ``hits@K`` (OGB's Hits@K:
  the share of positives scored above the K-th best negative), ``mrr`` (per-edge negatives),
  ``auc`` (ROC-AUC and average precision, the GAE protocol).

:meth:`LinkSplit.check` refuses, in one line each, pairs out of range, self-pairs and duplicate
pairs where OGB forbids them, negatives that are positives, and :func:`leaked_edges` counts the
held-out positives still present in a message-passing graph (a leak).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fullgraph.errors import DataError

#: The splits of a link dataset, in the order messages name them.
LINK_SPLITS = ("train", "valid", "test")
#: The splits with negatives to score.
EVAL_SPLITS = ("valid", "test")
#: OGB's metric per linkprop dataset (``ogb.linkproppred``'s master table); other names: ``auc``.
LINK_METRICS = {
    "ogbl-collab": "hits@50",
    "ogbl-ppa": "hits@100",
    "ogbl-ddi": "hits@20",
    "ogbl-citation2": "mrr",
}


def link_metric(name: str, per_edge_negatives: bool) -> str:
    """The metric a link dataset named ``name`` is scored by: OGB's for its own names
    (:data:`LINK_METRICS`), ``mrr`` for per-edge negatives, else ``auc`` (the GAE protocol)."""
    if name in LINK_METRICS:
        return LINK_METRICS[name]
    return "mrr" if per_edge_negatives else "auc"


def pair_keys(pairs: np.ndarray, num_nodes: int, undirected: bool) -> np.ndarray:
    """One int64 key per pair (``u * n + v``; undirected: of ``(min, max)``), for set tests."""
    u, v = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    if undirected:
        u, v = np.minimum(u, v), np.maximum(u, v)
    return u * np.int64(num_nodes) + v


def leaked_edges(pairs: np.ndarray, indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> int:
    """How many of ``pairs`` (held-out positives) are an edge, in either direction, of the
    message-passing graph in CSR (``indices[indptr[v]:indptr[v+1]]`` the sources of ``v``).

    The graph's entries are looked up, in chunks, among the (few) keys of the pairs, so the
    memory is the pairs' and one chunk's, whatever the graph's size."""
    if len(pairs) == 0:
        return 0
    n = np.int64(num_nodes)
    u, v = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    forward, backward = v * n + u, u * n + v  # edge u -> v: source u of row v; and v -> u
    wanted = np.unique(np.concatenate([forward, backward]))
    seen = np.zeros(wanted.size, dtype=np.bool_)
    rows = np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(indptr))
    last = wanted.size - 1
    for s in range(0, rows.size, CHECK_CHUNK):
        keys = rows[s : s + CHECK_CHUNK] * n + np.asarray(indices[s : s + CHECK_CHUNK], np.int64)
        at = np.minimum(np.searchsorted(wanted, keys), last)
        seen[at[wanted[at] == keys]] = True
    found = seen[np.searchsorted(wanted, forward)] | seen[np.searchsorted(wanted, backward)]
    return int(np.count_nonzero(found))


@dataclass
class LinkSplit:
    """Supervision edges of a link-prediction dataset (global node ids, int64).

    Attributes:
        name: the dataset's name (picks OGB's metric).
        num_nodes: nodes of the graph.
        edges: ``train`` / ``valid`` / ``test`` -> ``[E_s, 2]`` positive pairs.
        negatives: ``valid`` / ``test`` -> ``[N_s, 2]`` negative pairs, or with
            ``per_edge_negatives`` ``[E_s, K]`` negative targets of each positive's source.
        per_edge_negatives: the negatives' layout (above).
        undirected: a pair stands for both directions (duplicates and collisions are tested
            on ``(min, max)``); OGB's citation2 is directed.
        metric: ``hits@K``, ``mrr`` or ``auc`` (default: :func:`link_metric`).
        edge_weight: optional ``train`` / ``valid`` / ``test`` -> float32 ``[E_s]`` (collab's
            ``weight``), kept as OGB ships it.
    """

    name: str
    num_nodes: int
    edges: dict[str, np.ndarray]
    negatives: dict[str, np.ndarray]
    per_edge_negatives: bool = False
    undirected: bool = True
    metric: str = ""
    edge_weight: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.metric:
            self.metric = link_metric(self.name, self.per_edge_negatives)

    @property
    def num_negatives_per_edge(self) -> int:
        """K of per-edge negatives (0 for negative pairs)."""
        if not self.per_edge_negatives or "test" not in self.negatives:
            return 0
        return int(self.negatives["test"].shape[1])

    def negative_pairs(self, split: str) -> np.ndarray:
        """The negatives of ``split`` as ``[N, 2]`` pairs (per-edge targets paired with their
        positive's source, positive by positive)."""
        neg = self.negatives[split]
        if not self.per_edge_negatives:
            return neg
        src = np.repeat(self.edges[split][:, 0], neg.shape[1])
        return np.stack([src, neg.reshape(-1)], axis=1)

    def check(self, where: str = "") -> LinkSplit:
        """Refuse a malformed split in one line (:class:`~fullgraph.errors.DataError`).

        Checked: every split present with int64-convertible ``[E, 2]`` pairs (``[E, K]``
        per-edge negatives with ``E`` the split's positives), ids in ``[0, num_nodes)``, no
        self-pair, no duplicate positive across or within splits, no negative that is a
        positive of any split.

        Returns:
            ``self``.
        """
        at = f"{where}: " if where else ""
        n = int(self.num_nodes)
        keys: dict[str, np.ndarray] = {}
        for s in LINK_SPLITS:
            if s not in self.edges:
                raise DataError(f"{at}the link split has no {s!r} edges")
            pairs = np.asarray(self.edges[s])
            if pairs.ndim != 2 or pairs.shape[1] != 2:
                raise DataError(f"{at}{s} edges must be [E, 2], got shape {pairs.shape}")
            self.edges[s] = pairs = pairs.astype(np.int64, copy=False)
            _check_range(pairs, n, f"{at}{s} edge")
            self_pairs = np.flatnonzero(pairs[:, 0] == pairs[:, 1])
            if len(self_pairs):
                e = int(self_pairs[0])
                raise DataError(
                    f"{at}{s} edge {e} is a self-pair ({pairs[e, 0]}, {pairs[e, 1]}); "
                    f"{len(self_pairs)} in all"
                )
            k = pair_keys(pairs, n, self.undirected)
            uniq, first, counts = np.unique(k, return_index=True, return_counts=True)
            if np.any(counts > 1):
                e = int(first[np.argmax(counts > 1)])
                raise DataError(
                    f"{at}{s} edge ({pairs[e, 0]}, {pairs[e, 1]}) appears "
                    f"{int(counts.max())} times; {int((counts > 1).sum())} duplicated pairs"
                )
            keys[s] = uniq
        for i, a in enumerate(LINK_SPLITS):
            for b in LINK_SPLITS[i + 1 :]:
                both = np.intersect1d(keys[a], keys[b])
                if len(both):
                    u, v = divmod(int(both[0]), n)
                    raise DataError(
                        f"{at}{len(both)} edges are in both {a} and {b}, e.g. ({u}, {v})"
                    )
        positives = np.sort(np.concatenate([keys[s] for s in LINK_SPLITS]))
        for s in EVAL_SPLITS:
            if s not in self.negatives:
                raise DataError(f"{at}the link split has no {s!r} negatives")
            neg = np.asarray(self.negatives[s]).astype(np.int64, copy=False)
            if self.per_edge_negatives:
                if neg.ndim != 2 or neg.shape[0] != len(self.edges[s]):
                    raise DataError(
                        f"{at}{s} per-edge negatives must be [{len(self.edges[s])}, K], got "
                        f"shape {neg.shape}"
                    )
            elif neg.ndim != 2 or neg.shape[1] != 2:
                raise DataError(f"{at}{s} negatives must be [N, 2], got shape {neg.shape}")
            self.negatives[s] = neg
            _check_negatives(self, s, positives, at)
        return self

    def check_no_leak(self, indptr: np.ndarray, indices: np.ndarray, where: str = "") -> None:
        """Refuse a split whose held-out positives (``valid``, ``test``) are still edges of
        the message-passing graph (CSR of incoming edges), in one line naming how many."""
        for s in EVAL_SPLITS:
            count = leaked_edges(self.edges[s], indptr, indices, int(self.num_nodes))
            if count:
                at = f"{where}: " if where else ""
                raise DataError(
                    f"{at}{count} of {len(self.edges[s])} {s} edges are still in the "
                    f"message-passing graph (a leak): held-out edges must leave it in both "
                    f"directions (`fullgraph data linksplit` writes such a split)"
                )


def _check_range(pairs: np.ndarray, n: int, what: str) -> None:
    """One line for the first id of ``pairs`` outside ``[0, n)``."""
    bad = np.flatnonzero((pairs < 0).any(axis=1) | (pairs >= n).any(axis=1))
    if len(bad):
        e = int(bad[0])
        raise DataError(
            f"{what} {e} ({pairs[e, 0]}, {pairs[e, 1]}) is out of range for {n} nodes; "
            f"{len(bad)} in all"
        )


#: Negative pairs tested at a time by :meth:`LinkSplit.check` (its memory stays a few arrays
#: of this size, not of ogbl-citation2's 86.6M negative pairs per split).
CHECK_CHUNK = 1 << 22


def _check_negatives(split: LinkSplit, s: str, positives: np.ndarray, at: str) -> None:
    """The negatives of split ``s`` in range and none a positive (``positives``: the sorted
    keys of every split's positives), chunk by chunk, in the one-line messages of
    :meth:`LinkSplit.check`."""
    n = int(split.num_nodes)
    neg = split.negatives[s]
    width = int(neg.shape[1]) if split.per_edge_negatives else 1
    rows = max(1, CHECK_CHUNK // max(1, width))
    out_of_range, hits = 0, 0
    first_out = first_hit = None
    for lo in range(0, len(neg), rows):
        if split.per_edge_negatives:
            block = neg[lo : lo + rows]
            sources = np.repeat(split.edges[s][lo : lo + rows, 0], width)
            pairs = np.stack([sources, block.reshape(-1)], axis=1)
        else:
            pairs = neg[lo : lo + rows]
        bad = (pairs < 0).any(axis=1) | (pairs >= n).any(axis=1)
        if bad.any() or out_of_range:
            if first_out is None and bad.any():
                e = int(np.argmax(bad))
                first_out = (lo * width + e, pairs[e, 0], pairs[e, 1])
            out_of_range += int(bad.sum())
            continue
        keys = pair_keys(pairs, n, split.undirected)
        found = _in_sorted(positives, np.sort(keys))  # sorted queries: cache-friendly search
        if found:
            if first_hit is None:
                e = int(np.argmax(np.isin(keys, positives)))
                first_hit = (pairs[e, 0], pairs[e, 1])
            hits += found
    if first_out is not None:
        e, u, v = first_out
        raise DataError(
            f"{at}{s} negative {e} ({u}, {v}) is out of range for {n} nodes; {out_of_range} in all"
        )
    if first_hit is not None:
        raise DataError(
            f"{at}{hits} {s} negatives are positive edges, e.g. ({first_hit[0]}, {first_hit[1]})"
        )


def _in_sorted(keys: np.ndarray, query: np.ndarray) -> int:
    """How many of ``query`` (ascending) are in ``keys`` (ascending)."""
    if keys.size == 0 or query.size == 0:
        return 0
    at = np.minimum(np.searchsorted(keys, query), keys.size - 1)
    return int(np.count_nonzero(keys[at] == query))
