"""The supervision pairs of one rank (link prediction): which pairs, in which order, with
which negatives.

Every supervision edge lives at its source's owner (its *anchor*). A training step scores
the rank's positive edges (all of them, or one edge batch of OGB's recipe) and ``neg_ratio``
negatives per positive: ``(u, w_j)``, ``w_j`` hashed from (seed, epoch, edge, j) over every
node (:func:`negative_targets`, OGB's collab recipe draws its negatives uniformly too; a
negative that happens to be an edge is kept, as there). Batches are a hashed permutation of
the global edge ids (:func:`edge_batches`). All of it depends on the global edge ids only, so
every rank count draws the same pairs.

The pairs of a step are laid out in the rank's node blocks (:func:`pair_layout`): grouped by
the block of their anchor, ascending block, then (anchor global id, pair key); a block
without pairs gets one placeholder row of weight 0. Its :class:`~fullgraph.distributed.
tree_sum.BlockLayout` has the part's blocks, so the decoder's weight gradients and the loss
are per-block partials added in the node tree: the same bits at any rank count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS, LinkSplit
from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.pair_rows import NodeOwners, PairRows
from fullgraph.distributed.tree_sum import BlockLayout
from fullgraph.hashing import as_int64, key_chain, splitmix64_torch

#: Pairs scored at once in evaluation and prediction (bounds the ``[chunk, d]`` row buffers).
SCORE_CHUNK = 1 << 18
#: Streams of the link draws (a coordinate of their keys).
NEGATIVE_STREAM, BATCH_STREAM = 0x4E45, 0x4241


def _unit_hash(key: int, counters: np.ndarray) -> torch.Tensor:
    """splitmix64 of ``key + counter`` as a non-negative int64 (the low 63 bits)."""
    c = torch.from_numpy(np.asarray(counters, dtype=np.int64)) + as_int64(key)
    return splitmix64_torch(c) & ((1 << 63) - 1)


def negative_targets(
    seed: int, epoch: int, edge_ids: np.ndarray, ratio: int, num_nodes: int
) -> np.ndarray:
    """int64 [len(edge_ids), ratio]: negative ``j`` of edge ``e`` is ``hash(seed, epoch,
    e * ratio + j) mod num_nodes`` (the same at any rank count)."""
    key = key_chain(int(seed), NEGATIVE_STREAM, int(epoch))
    e = np.asarray(edge_ids, dtype=np.int64)
    counters = (e[:, None] * ratio + np.arange(ratio, dtype=np.int64)[None, :]).reshape(-1)
    h = _unit_hash(key, counters)
    return (h % int(num_nodes)).numpy().reshape(len(e), ratio)


def edge_batches(seed: int, epoch: int, num_edges: int, batch: int) -> np.ndarray:
    """The batch of every global training edge in ``epoch``: a hashed permutation cut into
    runs of ``batch`` edges (0 or ``batch >= num_edges``: one batch), int64 [num_edges]."""
    if batch <= 0 or batch >= num_edges:
        return np.zeros(num_edges, dtype=np.int64)
    key = key_chain(int(seed), BATCH_STREAM, int(epoch))
    h = _unit_hash(key, np.arange(num_edges, dtype=np.int64)).numpy()
    order = np.argsort(h, kind="stable")
    position = np.empty(num_edges, dtype=np.int64)
    position[order] = np.arange(num_edges, dtype=np.int64)
    return position // int(batch)


@dataclass
class PairSet:
    """Pairs of one rank in block order (:func:`pair_layout`).

    Attributes:
        anchors, targets: int64 [m] global ids (placeholders: the block's first node twice).
        keys: int64 [m] unique order keys (placeholders negative).
        labels: float32 [m] 1 positive, 0 negative; ``weights``: float32 [m], 0 on
            placeholders.
        layout: the rows' blocks (``None`` for a part without blocks: then no placeholders).
        ids: int64 [m], the edge's row in its split's array (-1 on placeholders).
    """

    anchors: np.ndarray
    targets: np.ndarray
    keys: np.ndarray
    labels: np.ndarray
    weights: np.ndarray
    ids: np.ndarray
    layout: BlockLayout | None

    @property
    def num_real(self) -> int:
        """Pairs that are not placeholders."""
        return int(np.count_nonzero(self.weights))


def pair_layout(
    anchors: np.ndarray,
    targets: np.ndarray,
    keys: np.ndarray,
    labels: np.ndarray,
    ids: np.ndarray,
    anchor_rows: np.ndarray,
    node_layout: BlockLayout | None,
    inner_global_ids: np.ndarray,
) -> PairSet:
    """The pairs in block order with a placeholder in every block of the part they miss.

    Args:
        anchors, targets, keys, labels, ids: the pairs (any order), [m] each.
        anchor_rows: int64 [m], each anchor's inner row on this rank.
        node_layout: the part's node blocks, or ``None`` (then sorted by (anchor, key)).
        inner_global_ids: int64 [num_inner], global id of each inner row.
    """
    anchors = np.asarray(anchors, dtype=np.int64)
    if node_layout is None:
        order = np.lexsort((keys, anchors))
        w = np.ones(len(order), dtype=np.float32)
        return PairSet(
            anchors[order], targets[order], keys[order], labels[order], w, ids[order], None
        )
    # the block (its index in the part's layout) of every inner row
    ptr = node_layout.block_ptr
    nb = len(node_layout.block_ids)
    row_block = np.empty(node_layout.num_rows, dtype=np.int64)
    row_block[node_layout.block_rows] = np.repeat(np.arange(nb, dtype=np.int64), np.diff(ptr))
    block = row_block[np.asarray(anchor_rows, dtype=np.int64)]
    missing = np.setdiff1d(np.arange(nb, dtype=np.int64), block)
    first_rows = node_layout.block_rows[ptr[missing]]
    pad = inner_global_ids[first_rows].astype(np.int64)
    all_block = np.concatenate([block, missing])
    all_anchor = np.concatenate([anchors, pad])
    all_keys = np.concatenate([np.asarray(keys, dtype=np.int64), -1 - missing])
    order = np.lexsort((all_keys, all_anchor, all_block))
    counts = np.bincount(all_block, minlength=nb)
    block_ptr = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(counts, out=block_ptr[1:])
    m = len(all_block)
    layout = BlockLayout(
        int(node_layout.num_blocks),
        node_layout.block_ids,
        np.arange(m, dtype=np.int64),
        block_ptr,
    )
    pad_f = np.zeros(len(missing), dtype=np.float32)
    return PairSet(
        anchors=all_anchor[order],
        targets=np.concatenate([np.asarray(targets, dtype=np.int64), pad])[order],
        keys=all_keys[order],
        labels=np.concatenate([np.asarray(labels, dtype=np.float32), pad_f])[order],
        weights=np.concatenate([np.ones(len(anchors), dtype=np.float32), pad_f])[order],
        ids=np.concatenate([np.asarray(ids, dtype=np.int64), -np.ones(len(missing), np.int64)])[
            order
        ],
        layout=layout,
    )


def training_pairs(
    edges: np.ndarray,
    edge_ids: np.ndarray,
    seed: int,
    epoch: int,
    ratio: int,
    num_nodes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The positives ``edges`` [e, 2] (global rows ``edge_ids``) and their hashed negatives:
    ``(anchors, targets, keys, labels, ids)``, key ``e * (ratio + 1) + j`` (``j = 0`` the
    positive)."""
    e = np.asarray(edge_ids, dtype=np.int64)
    neg = negative_targets(seed, epoch, e, ratio, num_nodes)
    r1 = ratio + 1
    anchors = np.concatenate([edges[:, 0], np.repeat(edges[:, 0], ratio)])
    targets = np.concatenate([edges[:, 1], neg.reshape(-1)])
    j = np.arange(1, r1, dtype=np.int64)
    keys = np.concatenate([e * r1, (e[:, None] * r1 + j[None, :]).reshape(-1)])
    labels = np.concatenate([np.ones(len(e), np.float32), np.zeros(len(e) * ratio, np.float32)])
    ids = np.concatenate([e, np.repeat(e, ratio)])
    return anchors.astype(np.int64), targets.astype(np.int64), keys, labels, ids


def rank_links(split: LinkSplit, inner_global_ids: np.ndarray) -> dict[str, np.ndarray]:
    """The supervision arrays of the rank owning ``inner_global_ids`` (the layout of a
    partition's ``Partition.link``): for each split ``s`` the edges anchored here ``s`` [e, 2]
    and their rows ``s_id``; for valid/test their negatives ``s_neg`` ([m, 2] pairs with rows
    ``s_neg_id``, or [e, K] per-edge targets aligned with ``s``)."""
    mine = np.zeros(int(split.num_nodes), dtype=bool)
    mine[np.asarray(inner_global_ids, dtype=np.int64)] = True
    out: dict[str, np.ndarray] = {}
    for s in LINK_SPLITS:
        edges = split.edges[s]
        rows = np.flatnonzero(mine[edges[:, 0]])
        out[s], out[f"{s}_id"] = edges[rows], rows.astype(np.int64)
        if s not in EVAL_SPLITS:
            continue
        neg = split.negatives[s]
        if split.per_edge_negatives:
            out[f"{s}_neg"] = neg[rows]
        else:
            keep = np.flatnonzero(mine[neg[:, 0]])
            out[f"{s}_neg"], out[f"{s}_neg_id"] = neg[keep], keep.astype(np.int64)
    return out


def link_meta(split: LinkSplit) -> dict[str, object]:
    """``meta.json["link"]`` of ``split`` as a partition records it: the metric, the
    negatives' layout, the node count and every split's global counts."""
    counts = {s: int(len(split.edges[s])) for s in LINK_SPLITS}
    for s in EVAL_SPLITS:
        neg = split.negatives[s]
        counts[f"{s}_neg"] = int(len(neg))  # rows: pairs, or positives with K targets each
    return {
        "name": split.name,
        "metric": split.metric,
        "per_edge_negatives": bool(split.per_edge_negatives),
        "undirected": bool(split.undirected),
        "num_nodes": int(split.num_nodes),
        "counts": counts,
    }


def score_pairs(
    comm: Communicator,
    owners: NodeOwners,
    decoder: torch.nn.Module,
    h: torch.Tensor,
    pairs: np.ndarray,
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """The decoder's logits of ``pairs`` [m, 2] (global ids, anchors this rank's) from the
    embeddings ``h`` of this rank's rows, float32 [m], in chunks of :data:`SCORE_CHUNK` (a
    collective: every rank runs as many chunks as the rank with the most pairs)."""
    counts = comm.allgather_object(len(pairs)) if comm.size > 1 else [len(pairs)]
    chunks = max(1, -(-max(counts) // SCORE_CHUNK))
    out = []
    n = int(h.shape[0])
    for c in range(chunks):
        part = np.asarray(pairs[c * SCORE_CHUNK : (c + 1) * SCORE_CHUNK], dtype=np.int64)
        part = part.reshape(-1, 2)
        keys = np.arange(len(part), dtype=np.int64)
        plan = PairRows.build(comm, owners, part[:, 0], part[:, 1], keys, n, False)
        hu, hv = plan.rows(h)
        out.append(decoder(hu, hv, dtype).float())
    return torch.cat(out)
