"""Link prediction in a PyG script: the parts of a link split, negatives, and gathered rows.

- :func:`link_graph` and :func:`link_splits`: what :func:`fullgraph.pyg.load_part` does with
  the ``(train_data, val_data, test_data)`` of ``T.RandomLinkSplit``: the training graph is
  partitioned (every split is encoded over it, the GAE protocol), and each split's
  ``edge_label_index`` / ``edge_label`` become this rank's pairs (those whose first node it
  owns; :class:`~fullgraph.pyg.pair_index.PairIndex`) and their labels, keyed by their column
  in the split;
- :func:`negative_sampling`: PyG's ``negative_sampling`` for such a part, drawn from hashes of
  (seed, training step, draw) instead of torch's generator: the same pairs at any rank count;
- :func:`gather`: rows split over the ranks (pairs' or nodes'), every rank's, in global order,
  for a metric of the script's own (``roc_auc_score(*pyg.gather(data.edge_label, out))``).
"""

from __future__ import annotations

import copy
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fullgraph.datasets import Graph
from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import ConfigError
from fullgraph.hashing import as_int64, key_chain, splitmix64_torch
from fullgraph.pyg.node_rows import NodeRows, plain, tag
from fullgraph.pyg.pair_index import PairPart, PairSet, owners_of

if TYPE_CHECKING:
    from torch_geometric.data import Data

#: The split names of ``T.RandomLinkSplit``'s three ``Data`` objects, in its order.
SPLITS = ("train", "val", "test")
#: The stream of :func:`negative_sampling`'s draws (a coordinate of their keys).
NEGATIVE_STREAM = 0x50594E47


def is_link_splits(source: Any) -> bool:
    """Whether ``source`` is a tuple or list of PyG ``Data`` that carry ``edge_label_index``
    (``T.RandomLinkSplit``'s ``(train_data, val_data, test_data)``)."""
    return (
        isinstance(source, (tuple, list))
        and len(source) > 0
        and all(getattr(d, "edge_label_index", None) is not None for d in source)
    )


def _pairs_of(data: Data, name: str, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(edge_label_index [2, m], edge_label [m])`` of one split, checked."""
    eli = data.edge_label_index
    if not isinstance(eli, torch.Tensor) or eli.dim() != 2 or eli.shape[0] != 2:
        shape = tuple(eli.shape) if isinstance(eli, torch.Tensor) else type(eli).__name__
        raise ConfigError(f"load_part: {name}_data.edge_label_index must be [2, m], got {shape}")
    if eli.dtype.is_floating_point or eli.dtype == torch.bool:
        raise ConfigError(f"load_part: {name}_data.edge_label_index holds {eli.dtype}, not ids")
    pairs = eli.detach().cpu().numpy().astype(np.int64)
    if pairs.size and (pairs.min() < 0 or pairs.max() >= num_nodes):
        bad = int(((pairs < 0) | (pairs >= num_nodes)).any(axis=0).sum())
        raise ConfigError(
            f"load_part: {name}_data.edge_label_index has {bad} pairs with a node id outside "
            f"[0, {num_nodes})"
        )
    label = getattr(data, "edge_label", None)
    if label is None:
        label = torch.ones(pairs.shape[1])
    if not isinstance(label, torch.Tensor) or tuple(label.shape[:1]) != (pairs.shape[1],):
        shape = tuple(label.shape) if isinstance(label, torch.Tensor) else type(label).__name__
        raise ConfigError(
            f"load_part: {name}_data.edge_label must hold one value per pair "
            f"({pairs.shape[1]}), got {shape}"
        )
    return pairs, label.detach().cpu().numpy()


def link_graph(splits: tuple | list) -> Graph:
    """The training graph of a link split (``splits[0]``'s edges, features and node count), as
    a :class:`~fullgraph.datasets.Graph`; labels are zero when the ``Data`` has none.

    Raises:
        ConfigError: not three splits, or splits of different node counts.
    """
    from fullgraph.datasets.pyg_input import graph_of

    if len(splits) != 3:
        raise ConfigError(
            f"load_part: a link split is (train_data, val_data, test_data) as T.RandomLinkSplit "
            f"returns them, got {len(splits)} Data"
        )
    counts = [int(d.num_nodes) for d in splits]
    if len(set(counts)) != 1:
        raise ConfigError(f"load_part: the splits have different node counts {counts}")
    train = copy.copy(splits[0])  # the tensors shared, the two attributes dropped
    for name in ("edge_label_index", "edge_label"):
        del train[name]
    if getattr(train, "y", None) is None:
        train.y = torch.zeros(counts[0], dtype=torch.long)
    return graph_of(train, "load_part")


def split_pairs(splits: tuple | list, num_nodes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every split's ``(edge_label_index [2, m], edge_label [m])``, checked (local work).

    Raises:
        ConfigError: a malformed ``edge_label_index`` or ``edge_label``, or a node id outside
            the graph.
    """
    return [_pairs_of(d, name, num_nodes) for name, d in zip(SPLITS, splits, strict=True)]


def agreed_pairs(
    comm: Communicator, pairs: list[tuple[np.ndarray, np.ndarray]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rank 0's pairs on every rank (a collective). ``T.RandomLinkSplit`` draws its held-out
    negatives from Python's ``random`` (not seeded by ``torch.manual_seed``), so the ranks'
    splits may differ there; rank 0 says so once, and every rank takes its pairs."""
    if comm.size == 1:
        return pairs
    import hashlib

    digest = hashlib.sha256(b"".join(a.tobytes() for pl in pairs for a in pl)).digest()
    if len(set(comm.allgather_object(digest))) == 1:
        return pairs
    if comm.rank == 0:
        print(
            "fullgraph.pyg: the ranks' link splits hold different pairs (RandomLinkSplit draws "
            "its negatives from Python's random module); every rank takes rank 0's",
            file=sys.stderr,
            flush=True,
        )
    return comm.allgather_object(pairs if comm.rank == 0 else None)[0]


def link_splits(
    splits: tuple | list,
    pairs: list[tuple[np.ndarray, np.ndarray]],
    base: Data,
    part: PairPart,
) -> tuple:
    """``(train_data, val_data, test_data)`` of this rank: copies of ``base`` (the part's
    ``Data``) with each split's ``edge_label_index`` (this rank's share of ``pairs``) and
    ``edge_label``.

    Rank 0 says once when ``val_data`` / ``test_data`` pass messages over more edges than
    ``train_data`` (``RandomLinkSplit`` adds the validation edges to the test graph): every
    split is encoded over the training graph here.
    """
    owners = owners_of(part)  # built by load_part (a collective)
    extra = [
        f"{name}_data {int(d.edge_index.shape[1]) - int(splits[0].edge_index.shape[1])}"
        for name, d in zip(SPLITS, splits, strict=True)
        if getattr(d, "edge_index", None) is not None
        and int(d.edge_index.shape[1]) > int(splits[0].edge_index.shape[1])
    ]
    if extra and part.comm.rank == 0:
        print(
            f"fullgraph.pyg: every split is encoded over train_data's graph (the GAE "
            f"protocol); the message-passing edges beyond it are not used ({', '.join(extra)})",
            file=sys.stderr,
            flush=True,
        )
    out = []
    for split_pairs_, label in pairs:
        mine = np.flatnonzero(owners.owner[split_pairs_[0]] == part.comm.rank)
        pset = PairSet(part, split_pairs_[:, mine], mine, split_pairs_.shape[1])
        data = copy.copy(base)  # shares x and the masks: one copy of the rows
        data.edge_index = data.fullgraph = part
        data.adj_t = part.adj_t
        data.edge_label_index = pset.index()
        labels = torch.from_numpy(np.ascontiguousarray(label[mine]))
        data.edge_label = tag(labels, part, True, pset.keys)
        out.append(data)
    return tuple(out)


def part_link_splits(part: PairPart, base: Data) -> tuple:
    """``(train_data, val_data, test_data)`` of a link partition's part (``fullgraph
    partition`` of a link dataset: every rank reads its own supervision edges): each split's
    positives (label 1, keyed by their row in the split), then for validation and test their
    negatives (label 0, keyed past the positives; citation2-style per-edge negatives ``[e, K]``
    as the pairs ``(u, v_k)`` of positive ``e``, keyed ``e * K + k``)."""
    from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS

    link, meta = part.part.link, part.part.meta["link"]
    counts = meta["counts"]
    out = []
    for s in LINK_SPLITS:
        pos, pos_id = link[s], link[f"{s}_id"]
        pairs, keys, labels, total = [pos.T], [pos_id], [np.ones(len(pos))], int(counts[s])
        if s in EVAL_SPLITS:
            neg = link[f"{s}_neg"]
            if meta["per_edge_negatives"]:
                k = neg.shape[1]
                anchors = np.repeat(pos[:, 0], k)
                pairs.append(np.stack([anchors, neg.reshape(-1)]))
                ids = (pos_id[:, None] * k + np.arange(k)[None, :]).reshape(-1)
                keys.append(total + ids)
                labels.append(np.zeros(len(anchors)))
                total += int(counts[s]) * k
            else:
                pairs.append(neg.T)
                keys.append(total + link[f"{s}_neg_id"])
                labels.append(np.zeros(len(neg)))
                total += int(counts[f"{s}_neg"])
        pset = PairSet(part, np.concatenate(pairs, axis=1), np.concatenate(keys), total)
        data = copy.copy(base)
        data.edge_label_index = pset.index()
        data.edge_label = tag(
            torch.from_numpy(np.concatenate(labels).astype(np.float32)), part, True, pset.keys
        )
        out.append(data)
    return tuple(out)


def _hash(key: int, counters: torch.Tensor) -> torch.Tensor:
    """splitmix64 of ``key + counter``, its low 63 bits (non-negative int64)."""
    return splitmix64_torch(counters + as_int64(key)) & ((1 << 63) - 1)


def _edge_keys(part: PairPart) -> np.ndarray:
    """``target * N + source`` of every edge into the rank's nodes, sorted (built once)."""
    keys = getattr(part, "_edge_keys", None)
    if keys is None:
        p = part.part
        n = int(part.num_nodes_global)
        dst = np.repeat(part.global_ids, np.diff(np.asarray(p.indptr, dtype=np.int64)))
        src = np.asarray(p.global_ids, dtype=np.int64)[np.asarray(p.indices, dtype=np.int64)]
        keys = np.unique(dst * n + src)
        part._edge_keys = keys
    return keys


def negative_sampling(
    edge_index: PairPart,
    num_nodes: int | tuple | None = None,
    num_neg_samples: int | None = None,
    method: str = "sparse",
    force_undirected: bool = False,
) -> torch.Tensor:
    """PyG's ``negative_sampling`` on this rank's part: random node pairs that are no edge (a
    collective: every rank calls it alike).

    Draw ``j`` of the job is ``(a, b)``, ``a`` and ``b != a`` hashed from (seed, training step,
    call in the step, ``j``) over every node; the rank keeps the draws whose ``a`` it owns,
    less those that are an edge into ``a`` (both directions of an undirected graph's edge)
    and repeats of an earlier draw. The job draws the sum over the ranks of
    ``num_neg_samples`` (each rank's count of its own pairs, as
    ``train_data.edge_label_index.size(1)`` gives it), so the pairs are the same at any rank
    count (PyG's draws from torch's generator; it too may return fewer than asked).

    Args:
        edge_index: ``train_data.edge_index`` of a link split (:func:`fullgraph.pyg.load_part`).
        num_nodes: PyG's argument: the graph's node count, or ``train_data.num_nodes`` (this
            rank's); ``None``: the graph's.
        num_neg_samples: this rank's share (default: its edge count, as PyG's default).
        method: ``"sparse"`` or ``"dense"`` (the same draws here).
        force_undirected: every draw gives both ``(a, b)`` and ``(b, a)``, each kept by the
            owner of its first node.

    Returns:
        This rank's negatives as a :class:`~fullgraph.pyg.pair_index.PairIndex` [2, m].

    Raises:
        ConfigError: ``edge_index`` is not a link split's part, ``num_nodes`` is neither
            count, a bipartite ``num_nodes`` tuple, or another ``method``.
    """
    if getattr(edge_index, "num_nodes_global", None) is None:
        raise ConfigError(
            f"pyg.negative_sampling: edge_index must be train_data.edge_index of "
            f"pyg.load_part's link split, got {type(edge_index).__name__}"
        )
    part = edge_index
    owners = owners_of(part)
    n = int(part.num_nodes_global)
    if isinstance(num_nodes, tuple):
        raise ConfigError(
            "pyg.negative_sampling: bipartite graphs (a num_nodes pair) are not supported"
        )
    if num_nodes is not None and int(num_nodes) not in (n, part.num_inner):
        raise ConfigError(
            f"pyg.negative_sampling: num_nodes={int(num_nodes)} is neither the graph's node "
            f"count ({n}) nor this rank's ({part.num_inner})"
        )
    if method not in ("sparse", "dense"):
        raise ConfigError(
            f"pyg.negative_sampling: method must be 'sparse' or 'dense', got {method!r}"
        )
    mine = part.num_edges if num_neg_samples is None else int(num_neg_samples)
    if mine < 0:
        raise ConfigError(f"pyg.negative_sampling: num_neg_samples={mine} is negative")
    total = torch.tensor([float(mine)], dtype=torch.float64)
    if part.comm.size > 1:
        total = part.comm.allreduce_(total, "sum", tag="metrics")
    draws = int(total.item())
    step_calls = getattr(part, "_negative_calls", (None, 0))
    call = step_calls[1] + 1 if step_calls[0] == part.step else 0
    part._negative_calls = (part.step, call)
    key = key_chain(part.seed, NEGATIVE_STREAM, part.step, call)
    j = torch.arange(draws, dtype=torch.int64)
    a = _hash(key, 2 * j) % n
    b = _hash(key, 2 * j + 1) % max(n - 1, 1)
    b = b + (b >= a).long()
    sides = [(a, b, 2 * j)] + ([(b, a, 2 * j + 1)] if force_undirected else [])
    anchors, targets, keys = [], [], []
    for u, v, k in sides:
        u, v, k = u.numpy(), v.numpy(), k.numpy()
        keep = owners.owner[u] == part.comm.rank
        anchors.append(u[keep])
        targets.append(v[keep])
        keys.append(k[keep] if force_undirected else k[keep] // 2)
    u, v, k = (np.concatenate(x) for x in (anchors, targets, keys))
    order = np.argsort(k, kind="stable")
    u, v, k = u[order], v[order], k[order]
    code = u * n + v
    edges = _edge_keys(part)
    found = np.searchsorted(edges, code)
    is_edge = (found < len(edges)) & (edges[np.minimum(found, len(edges) - 1)] == code)
    _, first = np.unique(code, return_index=True)  # a repeat's first draw stays
    keep = np.zeros(len(code), dtype=bool)
    keep[first] = True
    keep &= ~is_edge & (u != v)
    pset = PairSet(part, np.stack([u[keep], v[keep]]), k[keep], draws * len(sides))
    return pset.index()


def gather(*values: torch.Tensor) -> np.ndarray | tuple[np.ndarray, ...]:
    """Every rank's rows of ``values`` (node rows or pairs' rows of the converted model, or a
    split's ``edge_label``), as numpy arrays in global order (node id, or pair key) on every
    rank: one array for one value, a tuple for several (a collective).

    Raises:
        ConfigError: a value that is not rows split over the ranks, or whose rows are neither
            the part's nodes nor pairs in key order (rows picked by a mask).
    """
    out = []
    for i, v in enumerate(values):
        if not isinstance(v, NodeRows) or not v.fullgraph_rows:
            raise ConfigError(
                f"pyg.gather: argument {i} is not rows of the ranks (the converted model's "
                f"output, the pairs' rows, data.edge_label), got {type(v).__name__}"
            )
        part, keys = v.fullgraph_part, v.fullgraph_keys
        if keys is None and v.shape[0] == part.num_inner:
            keys = part.global_ids
        if keys is None:
            raise ConfigError(
                f"pyg.gather: argument {i} has {v.shape[0]} rows, neither the rank's nodes nor "
                f"a pair set's in order (gather whole rows, then pick)"
            )
        rows = plain(v).detach().cpu().numpy()
        pieces = part.comm.allgather_object((keys, rows)) if part.comm.size > 1 else [(keys, rows)]
        all_keys = np.concatenate([k for k, _ in pieces])
        order = np.argsort(all_keys, kind="stable")
        out.append(np.concatenate([r for _, r in pieces])[order])
    return out[0] if len(out) == 1 else tuple(out)
