"""Full-batch link prediction on one rank (``fullgraph train --task link``).

The encoder is the stack of any layer kind (:class:`~fullgraph.models.gnn.GNN`, its output
``--embed-dim`` wide), the decoder a dot product or OGB's Hadamard + MLP
(:mod:`fullgraph.models.link_decoder`). A step is one full-graph forward of the encoder, the
scores of the rank's pairs (:mod:`fullgraph.training.link_pairs`: its positive training
edges, or one edge batch of them, and hashed negatives), binary cross-entropy with logits
averaged over every rank's pairs, the backward and one optimiser step. The target rows of
pairs whose target lives elsewhere, and their gradients, travel through
:class:`~fullgraph.distributed.pair_rows.PairRows`: every node's gradient is the sum of its
pairs' terms in one global order. With the part's node blocks the decoder's weight gradients
and the loss are per-block partials in the same tree as the encoder's, so P ranks compute
one process's bits; without blocks the sums follow the rank split (float rounding).

Evaluation scores the validation and test positives and negatives (in chunks of
:data:`~fullgraph.training.link_pairs.SCORE_CHUNK` pairs), gathers every rank's scores in the
split's order and computes the split's metric (:func:`~fullgraph.link_metrics.link_scores`)
alike on every rank.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from fullgraph.datasets.link import EVAL_SPLITS
from fullgraph.distributed.pair_rows import NodeOwners, PairRows
from fullgraph.distributed.tree_sum import BlockGradients, collecting
from fullgraph.errors import ConfigError, mark_replicated
from fullgraph.kernels.pair_loss import pair_bce
from fullgraph.link_metrics import link_scores
from fullgraph.models.link_decoder import LinkModel
from fullgraph.partition import Partition
from fullgraph.run.epochs import EpochStats
from fullgraph.training.link_pairs import (
    edge_batches,
    link_meta,
    pair_layout,
    rank_links,
    score_pairs,
    training_pairs,
)
from fullgraph.training.trainer import StepResult, Trainer

#: What evaluation calls a split (the JSONL keys).
SPLIT_NAMES = {"valid": "val", "test": "test"}


def part_links(part: Partition, dataset: str | None, root: str | None) -> tuple[dict, dict]:
    """This rank's supervision arrays and ``meta.json["link"]``: the partition's, or for one
    process on ``dataset`` the whole split of :func:`~fullgraph.datasets.load_link_split`.

    Raises:
        ConfigError: no supervision edges (a node-classification partition or dataset).
    """
    links = getattr(part, "link", None)
    if links is not None and part.meta.get("link") is not None:
        return links, part.meta["link"]
    split = None
    if dataset is not None:
        from fullgraph.datasets import load_link_split

        split = load_link_split(dataset, root)
    if split is None:
        what = f"dataset {dataset!r}" if dataset else "this partition"
        raise ConfigError(
            f"--task link: {what} has no supervision edges; write a link split with `fullgraph "
            f"data linksplit` and partition that"
        )
    return rank_links(split, part.global_ids[: part.num_inner]), link_meta(split)


class LinkTrainer(Trainer):
    """Trains one rank's part for link prediction; every rank builds one with the same
    config and its own supervision arrays.

    Args:
        part: this rank's part.
        comm: the communicator.
        config: the experiment (``task="link"``).
        links: this rank's supervision arrays (``Partition.link``'s layout:
            :func:`~fullgraph.training.link_pairs.rank_links`); default ``part.link``.
        link_meta: ``metric``, ``per_edge_negatives``, ``num_nodes`` and the global counts
            ``num_train`` (default ``part.meta["link"]``).
        **kwargs: as :class:`~fullgraph.training.trainer.Trainer`.
    """

    def __init__(
        self,
        part: Partition,
        comm: Any,
        config: Any,
        links: dict[str, np.ndarray] | None = None,
        link_meta: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if config.task != "link":
            raise ConfigError("LinkTrainer trains --task link")
        links = links if links is not None else getattr(part, "link", None)
        meta = link_meta if link_meta is not None else part.meta.get("link")
        if links is None or meta is None:
            raise mark_replicated(
                ConfigError(
                    "--task link needs a partition with supervision edges: partition a link "
                    "dataset (`fullgraph data linksplit`, then `fullgraph partition`)"
                )
            )
        self.links, self.link_meta = links, meta
        self._inner_gids = np.asarray(part.global_ids[: part.num_inner], dtype=np.int64)
        # every node may be a pair's end (negatives are drawn over all of them): no layer is
        # pruned to the rows of training nodes
        config = dataclasses.replace(config, prune="off")
        super().__init__(part, comm, config, **kwargs)
        self.metric = str(meta["metric"])
        self.num_nodes = int(meta.get("num_nodes", part.meta.get("num_nodes")))
        self.num_train_edges = int(meta["counts"]["train"])
        if config.link_batch > self.num_train_edges:
            raise mark_replicated(
                ConfigError(
                    f"--link-batch {config.link_batch} is larger than the "
                    f"{self.num_train_edges} training edges: use at most that many, or 0 for "
                    f"one step over all of them"
                )
            )
        self.owners = NodeOwners(comm, self._inner_gids, self.num_nodes)
        self.history.pop("best_val_acc", None)

    def _build_model(self, part: Partition) -> LinkModel:  # type: ignore[override]
        """Encoder and decoder (:meth:`TrainConfig.build_model` of a link config), seeded,
        rank 0's parameters broadcast to every rank."""
        model = super()._build_model(part)
        assert isinstance(model, LinkModel)
        return model

    # -- one step ----------------------------------------------------------------------------
    def _step_pairs(self, epoch: int, batch_of: np.ndarray | None, batch: int) -> Any:
        """The pair set of one step: this rank's positives in ``batch`` and their negatives."""
        cfg = self.config
        edges, ids = self.links["train"], self.links["train_id"]
        if batch_of is not None:
            keep = batch_of[ids] == batch
            edges, ids = edges[keep], ids[keep]
        anchors, targets, keys, labels, pid = training_pairs(
            np.asarray(edges), np.asarray(ids), cfg.seed, epoch, cfg.neg_ratio, self.num_nodes
        )
        rows = self.owners.local[anchors]
        return pair_layout(
            anchors, targets, keys, labels, pid, rows, self.ctx.blocks, self._inner_gids
        )

    def link_step(self, epoch: int, pairs: Any, num_pairs: int) -> StepResult:
        """Forward, backward and update over ``pairs`` (``num_pairs``: every rank's)."""
        halo0, red0 = self.comm.wait_s["halo"], self.comm.wait_s["reduce"]
        t0 = time.perf_counter()
        self.model.train()
        tree = self.fresh_tree()
        ptree = BlockGradients(pairs.layout) if tree is not None else None
        plan = PairRows.build(
            self.comm, self.owners, pairs.anchors, pairs.targets, pairs.keys, self.num_inner
        )
        dev = self.device
        labels = torch.from_numpy(pairs.labels).to(dev)
        weights = torch.from_numpy(pairs.weights).to(dev)
        with self.ctx.plan.training_step(epoch), collecting(tree):
            h = self.model.encoder(self.data["x"], self.ctx, epoch=epoch, training=True)
            with collecting(ptree):
                hu, hv = plan.rows(h)
                scores = self.model.decoder(hu, hv, self.ctx.plan.row_dtype)
                per = pair_bce(scores, labels, weights)
                if ptree is not None:
                    ptree.add_loss(per, float(num_pairs))
                loss = per.sum() / num_pairs
            loss.backward()
        if tree is not None:
            tree.absorb(ptree)
        global_loss = self.apply_step(loss, epoch, tree)
        return StepResult(
            loss=global_loss,
            seconds=time.perf_counter() - t0,
            comm_s=self.comm.wait_s["halo"] - halo0,
            reduce_s=self.comm.wait_s["reduce"] - red0,
            logits=None,
        )

    @property
    def num_inner(self) -> int:
        """This rank's inner nodes."""
        return len(self._inner_gids)

    def train_epoch(self, epoch: int) -> EpochStats:
        """One step over every training edge, or one step per edge batch (``--link-batch``)."""
        cfg = self.config
        r1 = cfg.neg_ratio + 1
        batch_of = None
        counts = [self.num_train_edges]
        if 0 < cfg.link_batch < self.num_train_edges:  # else one batch
            batch_of = edge_batches(cfg.seed, epoch, self.num_train_edges, cfg.link_batch)
            counts = np.bincount(batch_of).tolist()
        stats = EpochStats()
        losses = []
        for b, count in enumerate(counts):
            pairs = self._step_pairs(epoch, batch_of, b)
            step = self.link_step(epoch, pairs, count * r1)
            losses.append(step.loss * count)
            stats.seconds += step.seconds
            stats.comm_s += step.comm_s
            stats.reduce_s += step.reduce_s
            stats.steps += 1
        stats.loss = float(sum(losses) / self.num_train_edges)
        return stats

    # -- evaluation --------------------------------------------------------------------------
    def _scores(self, h: torch.Tensor, pairs: np.ndarray) -> torch.Tensor:
        """The decoder's scores of ``pairs`` [m, 2] (anchors here; a collective)."""
        return score_pairs(
            self.comm, self.owners, self.model.decoder, h, pairs, self.ctx.plan.row_dtype
        )

    def _gathered(self, ids: np.ndarray, scores: torch.Tensor, total: int) -> np.ndarray:
        """Every rank's scores placed at their rows of the split (every rank gets all)."""
        mine = (np.asarray(ids, dtype=np.int64), scores.cpu().numpy())
        pieces = self.comm.allgather_object(mine) if self.comm.size > 1 else [mine]
        out = np.full(total, np.nan, dtype=np.float32)
        for rows, values in pieces:
            out[rows] = values
        return out

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """``val_<metric>`` and ``test_<metric>`` (and the metric's companions) of the
        current model, alike on every rank."""
        self.model.eval()
        h = self.model.encoder(self.data["x"], self.ctx, training=False)
        counts = self.link_meta["counts"]
        per_edge = bool(self.link_meta.get("per_edge_negatives", False))
        out: dict[str, float] = {}
        for split in EVAL_SPLITS:
            pos_pairs = np.asarray(self.links[split])
            pos = self._gathered(
                self.links[f"{split}_id"], self._scores(h, pos_pairs), int(counts[split])
            )
            neg_arr = np.asarray(self.links[f"{split}_neg"])
            if per_edge:
                k = neg_arr.shape[1] if neg_arr.ndim == 2 else 0
                k = max(self.comm.allgather_object(k)) if self.comm.size > 1 else k
                src = np.repeat(pos_pairs[:, 0], k)
                neg_pairs = np.stack([src, neg_arr.reshape(-1)], axis=1)
                ids = (self.links[f"{split}_id"][:, None] * k + np.arange(k)[None, :]).reshape(-1)
                neg = self._gathered(ids, self._scores(h, neg_pairs), int(counts[split]) * k)
                neg = neg.reshape(int(counts[split]), k)
            else:
                neg = self._gathered(
                    self.links[f"{split}_neg_id"],
                    self._scores(h, neg_arr),
                    int(counts[f"{split}_neg"]),
                )
            for name, value in link_scores(pos, neg, self.metric).items():
                out[f"{SPLIT_NAMES[split]}_{name}"] = float(value)
        return out

    def on_best(self, epoch: int, acc: dict[str, float]) -> None:
        """Keep the model (:meth:`Trainer.on_best`) and the metric's companions at the best
        validation epoch (``test_ap`` beside ``test_auc``; hits@1/3/10 beside ``mrr``)."""
        super().on_best(epoch, acc)
        m = self.metric
        self.history["link_at_best"] = {
            k: v for k, v in acc.items() if k not in (f"val_{m}", f"test_{m}")
        }

    def final_extra(self) -> dict[str, Any]:
        """The task, the decoder and the companions of the metric at the best epoch."""
        return {
            "task": "link",
            "decoder": self.config.decoder,
            **self.history.get("link_at_best", {}),
        }

    def record_extra(self, stats: EpochStats, maxes: dict[str, float]) -> dict[str, Any]:
        """Steps of the epoch."""
        return {"steps": stats.steps}
