"""The supervision edges of a link-prediction split, cut into the parts of a partition.

A partition of a link dataset (issue 35) is built on the message-passing graph and carries the
split's supervision edges (:class:`~fullgraph.datasets.link.LinkSplit`, global node ids). Each
edge is stored once, by the part that owns its *anchor*, its source (column 0), so the rank
scoring it holds the source's embedding row. Per part ``r``, for ``s`` in ``train``,
``valid``, ``test`` (all int64):

================== =========== =========================================================
file               shape       meaning
================== =========== =========================================================
link_<s>           [e, 2]      the positive pairs anchored here (global ids)
link_<s>_id        [e]         their rows in ``LinkSplit.edges[s]``
link_<s>_neg       [m, 2]      valid/test: negative pairs anchored here; with per-edge
                   or [e, K]   negatives, the K negative targets of ``link_<s>``'s rows
link_<s>_neg_id    [m]         valid/test, negative pairs only: their rows in
                               ``LinkSplit.negatives[s]``
================== =========== =========================================================

Rows are sorted by (anchor global id, row id), so the files do not depend on any hash or dict
order. ``meta.json["link"]`` holds the split's ``name``, ``num_nodes``, ``metric``,
``per_edge_negatives``,
``undirected``, ``num_negatives_per_edge`` (K, 0 for pairs), ``counts`` (``train``,
``valid``, ``valid_neg``, ``test``, ``test_neg``: rows of each split's arrays) and
``split_sha256`` (:func:`split_digest`); ``parts[r]["link"]`` the same counts of part ``r``.
A loaded part gives them as ``Partition.link`` (keys without the ``link_`` prefix);
:mod:`~fullgraph.partition.link_verify` checks them over all parts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fullgraph.datasets.link import EVAL_SPLITS, LINK_SPLITS, LinkSplit
from fullgraph.errors import DataError, PartitionError
from fullgraph.partition.format import LINK_ARRAYS, META_NAME, REWRITE, file_key

if TYPE_CHECKING:
    from fullgraph.datasets.graph import Graph

#: The row counts ``meta.json["link"]["counts"]`` (and every ``parts[r]["link"]``) records.
COUNT_KEYS = ("train", "valid", "valid_neg", "test", "test_neg")
#: The fields of ``meta.json["link"]`` and their JSON types.
LINK_META_TYPES = {
    "name": str,
    "metric": str,
    "per_edge_negatives": bool,
    "undirected": bool,
    "num_negatives_per_edge": int,
    "counts": dict,
    "split_sha256": str,
}
#: The prefix of the link arrays' file names (``Partition.link`` keys go without it).
PREFIX = "link_"


def hash_array(h: hashlib._Hash, array: np.ndarray) -> None:
    """Feed ``array`` (as little-endian int64, with its shape) to the hash ``h``."""
    a = np.ascontiguousarray(array, dtype="<i8")
    h.update(json.dumps(list(a.shape)).encode())
    h.update(memoryview(a).cast("B"))


def split_digest(split: LinkSplit) -> str:
    """SHA-256 of a split's supervision arrays: its node count, negatives' layout and
    direction, then ``edges[train|valid|test]`` and ``negatives[valid|test]`` (int64 with their
    shapes); the ``split_sha256`` of ``meta.json["link"]`` (edge weights are not stored)."""
    h = hashlib.sha256()
    flags = [int(split.num_nodes), bool(split.per_edge_negatives), bool(split.undirected)]
    h.update(json.dumps(flags).encode())
    for s in LINK_SPLITS:
        hash_array(h, split.edges[s])
    for s in EVAL_SPLITS:
        hash_array(h, split.negatives[s])
    return h.hexdigest()


def check_link_split(split: LinkSplit, graph: Graph) -> LinkSplit:
    """Refuse, in one line, a split of another graph, a malformed one
    (:meth:`~fullgraph.datasets.link.LinkSplit.check`) or one whose held-out positives are
    still edges of ``graph``, the message-passing graph (a leak).

    Returns:
        ``split`` (checked).

    Raises:
        DataError: the first problem.
    """
    if int(split.num_nodes) != graph.num_nodes:
        raise DataError(
            f"{split.name}: the link split is of a graph of {split.num_nodes} nodes but "
            f"{graph.name} has {graph.num_nodes}; give the split made from this graph"
        )
    split.check(split.name)
    if split.per_edge_negatives:
        widths = {s: int(split.negatives[s].shape[1]) for s in EVAL_SPLITS}
        if len(set(widths.values())) > 1:
            raise DataError(
                f"{split.name}: per-edge negatives of {widths['valid']} targets for valid but "
                f"{widths['test']} for test; give every positive the same number K"
            )
    split.check_no_leak(graph.indptr, graph.indices, split.name)
    return split


def dataset_link_split(name: str, root: str | Path) -> LinkSplit | None:
    """The link split of the dataset ``name`` under ``root``
    (``fullgraph.datasets.load_link_split``, checked), ``None`` for a dataset without one or
    a ``fullgraph.datasets`` without link datasets."""
    import fullgraph.datasets as datasets

    reader = getattr(datasets, "load_link_split", None)
    return None if reader is None else reader(name, root)


def link_arrays(meta: dict) -> tuple[str, ...]:
    """The link arrays each part of a partition with this ``meta.json`` stores (none without
    ``meta["link"]``), in the order they are written."""
    if "link" not in meta:
        return ()
    names = []
    for s in LINK_SPLITS:
        names += [f"{PREFIX}{s}", f"{PREFIX}{s}_id"]
        if s in EVAL_SPLITS:
            names.append(f"{PREFIX}{s}_neg")
            if not meta["link"]["per_edge_negatives"]:
                names.append(f"{PREFIX}{s}_neg_id")
    return tuple(names)


def link_view(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``Partition.link`` from a part's arrays by file name: the link arrays, keys without
    the ``link_`` prefix (``train``, ``train_id``, ``valid``, ``valid_neg``, ...)."""
    return {k.removeprefix(PREFIX): v for k, v in arrays.items() if k in LINK_ARRAYS}


class LinkParts:
    """A split cut by a node assignment: every part's link arrays, built one part at a time.

    Holds one int64 order per array (rows grouped by the anchor's owner, then by anchor global
    id, then by row id) and its part offsets; :meth:`arrays` gathers part ``r``'s rows.

    Args:
        split: a checked split.
        owner: int64 [num_nodes], the owner of every node.
        num_parts: P.
    """

    def __init__(self, split: LinkSplit, owner: np.ndarray, num_parts: int) -> None:
        self.split = split
        self.num_parts = int(num_parts)
        owner = np.asarray(owner, dtype=np.int64)
        self._order: dict[str, np.ndarray] = {}
        self._offsets: dict[str, np.ndarray] = {}
        n = np.int64(split.num_nodes)
        sources = {s: split.edges[s] for s in LINK_SPLITS}
        if not split.per_edge_negatives:
            sources.update({f"{s}_neg": split.negatives[s] for s in EVAL_SPLITS})
        for key, pairs in sources.items():
            anchor = np.asarray(pairs[:, 0], dtype=np.int64)
            part = owner[anchor]
            self._order[key] = np.argsort(part * n + anchor, kind="stable").astype(np.int64)
            offsets = np.zeros(self.num_parts + 1, dtype=np.int64)
            np.cumsum(np.bincount(part, minlength=self.num_parts), out=offsets[1:])
            self._offsets[key] = offsets
        self.digest = split_digest(split)

    def _rows(self, key: str, rank: int) -> np.ndarray:
        off = self._offsets[key]
        return self._order[key][off[rank] : off[rank + 1]]

    def arrays(self, rank: int) -> dict[str, np.ndarray]:
        """Part ``rank``'s link arrays by file name (``link_train``, ``link_train_id``, ...)."""
        split, out = self.split, {}
        for s in LINK_SPLITS:
            rows = self._rows(s, rank)
            out[f"{PREFIX}{s}"] = np.asarray(split.edges[s][rows], dtype=np.int64)
            out[f"{PREFIX}{s}_id"] = rows
            if s not in EVAL_SPLITS:
                continue
            if split.per_edge_negatives:
                out[f"{PREFIX}{s}_neg"] = np.asarray(split.negatives[s][rows], dtype=np.int64)
            else:
                neg_rows = self._rows(f"{s}_neg", rank)
                out[f"{PREFIX}{s}_neg"] = np.asarray(split.negatives[s][neg_rows], np.int64)
                out[f"{PREFIX}{s}_neg_id"] = neg_rows
        return out

    def counts(self, rank: int) -> dict[str, int]:
        """Rows of part ``rank``'s arrays (``parts[rank]["link"]`` of ``meta.json``)."""
        rows = {s: int(self._rows(s, rank).size) for s in LINK_SPLITS}
        for s in EVAL_SPLITS:
            key = f"{s}_neg"
            rows[key] = (
                rows[s] if self.split.per_edge_negatives else int(self._rows(key, rank).size)
            )
        return {k: rows[k] for k in COUNT_KEYS}

    def meta(self) -> dict:
        """``meta.json["link"]``: the split's name, metric, layout, counts and digest."""
        split = self.split
        counts = {s: int(len(split.edges[s])) for s in LINK_SPLITS}
        counts.update({f"{s}_neg": int(len(split.negatives[s])) for s in EVAL_SPLITS})
        return {
            "name": split.name,
            "num_nodes": int(split.num_nodes),
            "metric": split.metric,
            "per_edge_negatives": bool(split.per_edge_negatives),
            "undirected": bool(split.undirected),
            "num_negatives_per_edge": int(split.num_negatives_per_edge),
            "counts": {k: counts[k] for k in COUNT_KEYS},
            "split_sha256": self.digest,
        }


def _count(meta_path: Path, where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PartitionError(f"{meta_path}: {where} must be a non-negative integer, got {value!r}")
    return value


def check_link_meta(meta: dict, meta_path: Path) -> None:
    """``meta.json["link"]`` (when present): its fields and types, and every part's
    ``parts[r]["link"]`` counts adding up to its ``counts``.

    Raises:
        PartitionError: one line naming the file and the field.
    """
    info = meta.get("link")
    if info is None:
        return
    if not isinstance(info, dict):
        raise PartitionError(f"{meta_path}: link must be a JSON object")
    for key, kind in LINK_META_TYPES.items():
        value = info.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise PartitionError(f"{meta_path}: link.{key} must be a {kind.__name__}; {REWRITE}")
    if info.get("num_nodes", meta["num_nodes"]) != meta["num_nodes"]:  # older ones have none
        raise PartitionError(
            f"{meta_path}: link.num_nodes is {info['num_nodes']} but num_nodes is "
            f"{meta['num_nodes']}; {REWRITE}"
        )
    k = _count(meta_path, "link.num_negatives_per_edge", info["num_negatives_per_edge"])
    if info["per_edge_negatives"] != (k > 0):
        raise PartitionError(
            f"{meta_path}: link.num_negatives_per_edge is {k} with per_edge_negatives "
            f"{info['per_edge_negatives']}; {REWRITE}"
        )
    totals = {
        key: _count(meta_path, f"link.counts.{key}", info["counts"].get(key)) for key in COUNT_KEYS
    }
    sums = dict.fromkeys(COUNT_KEYS, 0)
    for r, part in enumerate(meta["parts"]):
        counts = part.get("link")
        if not isinstance(counts, dict):
            raise PartitionError(f"{meta_path}: parts[{r}] lacks its link counts; {REWRITE}")
        for key in COUNT_KEYS:
            sums[key] += _count(meta_path, f"parts[{r}].link.{key}", counts.get(key))
        for s in EVAL_SPLITS:
            if info["per_edge_negatives"] and counts[f"{s}_neg"] != counts[s]:
                raise PartitionError(
                    f"{meta_path}: parts[{r}].link.{s}_neg is {counts[f'{s}_neg']}, not its "
                    f"{counts[s]} {s} edges (per-edge negatives); {REWRITE}"
                )
    for key in COUNT_KEYS:
        if sums[key] != totals[key]:
            raise PartitionError(
                f"{meta_path}: link.counts.{key} is {totals[key]} but the parts' link.{key} add "
                f"up to {sums[key]}; {REWRITE}"
            )


def check_part_link(root: Path, meta: dict, rank: int, link: dict[str, np.ndarray]) -> None:
    """The cheap invariants of part ``rank``'s link arrays (one pass each): shapes against
    ``parts[rank]["link"]`` and K, row ids below the split's counts, node ids below
    ``num_nodes``.

    Raises:
        PartitionError: one line naming the file.
    """
    info, rows = meta["link"], meta["parts"][rank]["link"]
    n, k = int(meta["num_nodes"]), int(info["num_negatives_per_edge"])
    shapes = {}
    for s in LINK_SPLITS:
        shapes[s], shapes[f"{s}_id"] = (rows[s], 2), (rows[s],)
    for s in EVAL_SPLITS:
        if info["per_edge_negatives"]:
            shapes[f"{s}_neg"] = (rows[s], k)
        else:
            shapes[f"{s}_neg"], shapes[f"{s}_neg_id"] = (rows[f"{s}_neg"], 2), (rows[f"{s}_neg"],)
    for key, want in shapes.items():
        array, path = link[key], root / file_key(rank, PREFIX + key)
        if array.shape != want:
            raise PartitionError(
                f"{path} has shape {list(array.shape)}, expected {list(want)} "
                f"({META_NAME}'s parts[{rank}].link); {REWRITE}"
            )
        if not array.size:
            continue
        low, high = int(array.min()), int(array.max())
        if key.endswith("_id"):
            total = info["counts"][key.removesuffix("_id")]
            if low < 0 or high >= total:
                raise PartitionError(
                    f"{path} holds row {low if low < 0 else high}, outside the split's {total} "
                    f"rows; {REWRITE}"
                )
        elif low < 0 or high >= n:
            raise PartitionError(
                f"{path} holds node {low if low < 0 else high}, outside [0, {n}); {REWRITE}"
            )
