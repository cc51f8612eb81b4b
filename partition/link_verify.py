"""Checking the supervision edges of a link partition over all its parts (``fullgraph verify``).

The arrays are described in :mod:`fullgraph.partition.link_parts`: here every row of every
split is found once over the parts, at its anchor's owner, sorted; the arrays rebuilt from the
parts hash to ``meta.json["link"]["split_sha256"]``; and no held-out positive is an edge of the
message-passing graph the parts store.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS, LinkSplit
from fullgraph.errors import PartitionError
from fullgraph.partition.format import META_NAME, REWRITE
from fullgraph.partition.link_parts import hash_array, split_digest
from fullgraph.partition.load import Partition


def _fail(p: Partition, msg: str) -> PartitionError:
    return PartitionError(f"part-{p.rank}: {msg}")


def _gather(
    parts: list[Partition], key: str, owner: np.ndarray, total: int, width: int, ids: str
) -> np.ndarray:
    """The whole array ``key`` of the split rebuilt from the parts' rows (``width`` columns,
    placed by the row ids of ``link_<ids>``), checked: anchors inner (column 0 of
    ``link_<ids without _id>``), rows sorted by (anchor, row id), every row of the split stored
    once over the parts."""
    anchored = ids.removesuffix("_id")
    whole = np.zeros((total, width), dtype=np.int64)
    seen = np.zeros(total, dtype=np.int64)
    for p in parts:
        rows, row_ids = np.asarray(p.link[key]), np.asarray(p.link[ids])
        anchor = np.asarray(p.link[anchored])[:, 0]
        foreign = np.flatnonzero(owner[anchor] != p.rank)
        if foreign.size:
            i = int(foreign[0])
            raise _fail(
                p,
                f"row {i} of link_{anchored} is anchored at node {int(anchor[i])}, which "
                f"part-{int(owner[anchor[i]])} owns (an edge is stored at its source's owner); "
                f"{REWRITE}",
            )
        step, id_step = np.diff(anchor), np.diff(row_ids)
        bad = np.flatnonzero((step < 0) | ((step == 0) & (id_step <= 0)))
        if bad.size:
            raise _fail(
                p, f"link_{anchored} is not sorted by (anchor, row id) at row {int(bad[0]) + 1}"
            )
        seen += np.bincount(row_ids, minlength=total)
        whole[row_ids] = rows
    wrong = np.flatnonzero(seen != 1)
    if wrong.size:
        e = int(wrong[0])
        raise PartitionError(
            f"row {e} of the {key} link arrays is stored {int(seen[e])} times over the parts "
            f"(each once); {int(wrong.size)} rows are wrong; {REWRITE}"
        )
    return whole


def _leaks(parts: list[Partition], owner: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Which ``pairs`` (held-out positives) are an edge, either direction, of the parts'
    message-passing graph: edge ``u -> v`` is stored by ``v``'s owner, ``v -> u`` by ``u``'s."""
    n = np.int64(owner.shape[0])
    found = np.zeros(len(pairs), dtype=bool)
    u, v = pairs[:, 0], pairs[:, 1]
    for p in parts:
        ni = p.num_inner
        gids = np.asarray(p.global_ids)
        stored = np.repeat(gids[:ni], np.diff(p.indptr)) * n + gids[np.asarray(p.indices)]
        stored.sort()
        for target, source in ((v, u), (u, v)):
            mine = np.flatnonzero(owner[target] == p.rank)
            keys = target[mine] * n + source[mine]
            at = np.minimum(np.searchsorted(stored, keys), max(stored.size - 1, 0))
            if stored.size:
                found[mine[stored[at] == keys]] = True
    return found


def verify_link(
    parts: list[Partition], meta: dict, owner: np.ndarray, split: LinkSplit | None = None
) -> dict:
    """Check the parts' link arrays: every row of every split stored once over the parts,
    at its anchor's owner, sorted; the arrays rebuilt from the parts hashing to
    ``split_sha256`` (and, with ``split``, that split's digest); no held-out positive in the
    message-passing graph of the parts' CSR.

    Returns:
        ``{"name", "metric", "num_negatives_per_edge", "counts", "leaked"}`` (``leaked`` is
        0: any leak raises).

    Raises:
        PartitionError: the first problem, in one line.
    """
    info = meta["link"]
    if split is not None and split_digest(split) != info["split_sha256"]:
        raise PartitionError(
            f"the link split {split.name} differs from the one the partition was built with "
            f"(split_sha256 of {META_NAME}); partition again with this split"
        )
    counts = info["counts"]
    h = hashlib.sha256()
    flags = [int(meta["num_nodes"]), bool(info["per_edge_negatives"]), bool(info["undirected"])]
    h.update(json.dumps(flags).encode())
    held_out = {}
    for s in LINK_SPLITS:
        whole = _gather(parts, s, owner, counts[s], 2, f"{s}_id")
        hash_array(h, whole)
        if s in EVAL_SPLITS:
            held_out[s] = whole
    k = int(info["num_negatives_per_edge"])
    for s in EVAL_SPLITS:
        key = f"{s}_neg"
        if info["per_edge_negatives"]:
            hash_array(h, _gather(parts, key, owner, counts[key], k, f"{s}_id"))
        else:
            hash_array(h, _gather(parts, key, owner, counts[key], 2, f"{key}_id"))
    if h.hexdigest() != info["split_sha256"]:
        raise PartitionError(
            f"the parts' link arrays differ from the split_sha256 of {META_NAME} (a link "
            f"file was changed); {REWRITE}"
        )
    for s, pairs in held_out.items():
        leaked = int(np.count_nonzero(_leaks(parts, owner, pairs)))
        if leaked:
            raise PartitionError(
                f"{leaked} of {len(pairs)} {s} edges are edges of the parts' message-passing "
                f"graph (a leak): held-out edges must leave it in both directions; partition "
                f"a split without the leak (`fullgraph data linksplit` writes one)"
            )
    return {
        "name": info["name"],
        "metric": info["metric"],
        "num_negatives_per_edge": k,
        "counts": dict(counts),
        "leaked": 0,
    }
