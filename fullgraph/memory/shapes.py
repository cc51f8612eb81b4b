"""The sizes the memory model needs (:mod:`fullgraph.memory.model`): of a partition and of
each of its parts, all in ``meta.json`` (or of a whole graph in one process)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fullgraph.partition import Partition


@dataclass(frozen=True)
class PartShape:
    """The sizes of one part the model needs (all in ``meta.json``).

    Attributes:
        rank: the part.
        num_inner: ``n``, rows the rank owns.
        num_halo: ``h``, rows it receives per exchange.
        num_edges: ``e``, stored in-edges of its rows.
        num_send: ``S``, rows it sends per exchange.
        num_train: ``t``, its training rows.
        halo_edges: ``e_h``, its edges from halo rows (estimated: ``edge_cut * e / E``).
        link_train: its supervision training edges (link prediction; 0 otherwise).
    """

    rank: int
    num_inner: int
    num_halo: int
    num_edges: int
    num_send: int
    num_train: int
    halo_edges: int
    link_train: int = 0


@dataclass(frozen=True)
class GraphShape:
    """The sizes of a partition the model needs, from its ``meta.json``."""

    dataset: str
    num_parts: int
    num_features: int
    num_classes: int
    parts: tuple[PartShape, ...]
    #: the parts store edge weights (``4 e``) and weighted in-degrees (``8 (n + h)``)
    edge_weight: bool = False
    #: width ``F_e`` of the stored edge feature rows (``4 e F_e``; 0: none)
    edge_dim: int = 0
    #: link prediction: every part's training edges, and the most pairs one evaluation
    #: split scores (positives and negatives; 0 for node classification)
    link_train_total: int = 0
    link_eval_pairs: int = 0

    def edge_value_bytes(self, part: PartShape) -> int:
        """Bytes of ``part``'s stored edge values as loaded (``edge_weight``, ``in_weight``,
        ``edge_attr``)."""
        e, local = part.num_edges, part.num_inner + part.num_halo
        weights = (4 * e + 8 * local) if self.edge_weight else 0
        return weights + 4 * e * self.edge_dim

    @property
    def max_rows(self) -> int:
        """The most rows any rank sends or receives in one exchange (sets the slice count)."""
        return max((max(p.num_send, p.num_halo) for p in self.parts), default=0)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> GraphShape:
        """The shape of a checked ``meta.json`` (:func:`fullgraph.partition.read_meta`)."""
        total = max(int(meta["num_edges"]), 1)
        cut = int(meta["edge_cut"])
        parts = []
        for r, p in enumerate(meta["parts"]):
            sent = meta["files"].get(f"part-{r}/send_index.npy", {}).get("shape", [0])[0]
            e = int(p["num_edges"])
            parts.append(
                PartShape(
                    rank=r,
                    num_inner=int(p["num_inner"]),
                    num_halo=int(p["num_halo"]),
                    num_edges=e,
                    num_send=int(p.get("num_send", sent)),
                    num_train=int(p["num_train"]),
                    halo_edges=min(e, math.ceil(cut * e / total)),
                    link_train=int(p.get("link", {}).get("train", 0)),
                )
            )
        link = meta.get("link") or {}
        counts = link.get("counts", {})
        k = int(link.get("num_negatives_per_edge", 0) or 0)
        per_edge = bool(link.get("per_edge_negatives", False))
        evals = [
            int(counts.get(s, 0)) + int(counts.get(f"{s}_neg", 0)) * (k if per_edge else 1)
            for s in ("valid", "test")
        ]
        return cls(
            dataset=str(meta["dataset"]),
            num_parts=int(meta["num_parts"]),
            num_features=int(meta["num_features"]),
            num_classes=int(meta["num_classes"]),
            parts=tuple(parts),
            edge_weight=bool(meta.get("edge_weight", False)),
            edge_dim=int(meta.get("edge_dim", 0)),
            link_train_total=int(counts.get("train", 0)),
            link_eval_pairs=max(evals),
        )

    @classmethod
    def from_part(cls, part: Partition, dataset: str = "") -> GraphShape:
        """The shape of a one-rank job's part (a whole graph: no halo, nothing sent; a link
        part's supervision edges)."""
        link = getattr(part, "link", None) or {}
        train = int(len(link["train"])) if "train" in link else 0
        evals = []
        for name in ("valid", "test"):
            if name in link and f"{name}_neg" in link:
                neg = link[f"{name}_neg"]  # pairs [m, 2] (with row ids), or [e, K] targets
                pairs = len(neg) if f"{name}_neg_id" in link else int(neg.size)
                evals.append(int(len(link[name])) + pairs)
        return cls(
            dataset=dataset,
            num_parts=1,
            num_features=int(part.num_features),
            num_classes=int(part.num_classes),
            parts=(
                PartShape(
                    rank=0,
                    num_inner=int(part.num_inner),
                    num_halo=0,
                    num_edges=int(part.num_edges),
                    num_send=0,
                    num_train=int(part.train_mask.sum()),
                    halo_edges=0,
                    link_train=train,
                ),
            ),
            edge_weight=part.edge_weight is not None,
            edge_dim=int(part.edge_dim),
            link_train_total=train,
            link_eval_pairs=max(evals, default=0),
        )
