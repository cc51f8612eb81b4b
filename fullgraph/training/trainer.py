"""The full-batch trainer of one rank: its step, its evaluation, its checkpoints.

All ranks run the same loop (:class:`~fullgraph.run.epochs.EpochLoop`) on their own part.
The loss is the sum over this rank's training nodes divided by the GLOBAL number of training
nodes, so summing the ranks' gradients (one all-reduce per step) gives exactly the full-graph
gradient; parameters start identical (same seed, then a broadcast from rank 0) and therefore
stay identical.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.distributed import Communicator, check_device
from fullgraph.distributed.faults import injected_failure_epoch
from fullgraph.distributed.tree_sum import BlockGradients, collecting
from fullgraph.errors import ConfigError, mark_replicated
from fullgraph.metrics import resolve_metric
from fullgraph.models.gnn import GNN, load_parameter_vector, parameter_vector
from fullgraph.partition import Partition
from fullgraph.precision import Precision, resolve_precision
from fullgraph.propagation.cache import HopCache
from fullgraph.propagation.correct_smooth import CorrectSmooth, smoothed_metrics, symmetric_operator
from fullgraph.run.checkpoint import CheckpointDir
from fullgraph.run.epochs import (
    EpochLoop,
    EpochStats,
    check_finite,
    reduce_gradients,
)
from fullgraph.run.metrics import split_metrics
from fullgraph.run.optim import Adam, scheduled_lr
from fullgraph.run.options import RunOptions
from fullgraph.run.torch_file import check_values, named_values
from fullgraph.training.assembly import assemble_rank
from fullgraph.training.config import TrainConfig
from fullgraph.training.model_file import model_state, save_model_file
from fullgraph.training.train_rows import train_rows

__all__ = ["StepResult", "TrainConfig", "Trainer", "check_finite"]

#: The one line rank 0 prints when the part carries no fixed node blocks.
NO_BLOCKS_NOTE = (
    "note: this partition has no fixed node blocks (it was written before them), so the "
    "bit-identical contract is off: the ranks' sums over nodes follow the rank split and match "
    "one process to float rounding only; re-partition with `fullgraph partition` to get it"
)


@dataclass
class StepResult:
    """One optimisation step: global loss, timings (this rank) and the training logits
    (``None`` when the step was asked not to keep them).

    ``codec_s`` is the time spent encoding and decoding compressed halo rows (part of the
    compute time).
    """

    loss: float
    seconds: float
    comm_s: float
    reduce_s: float
    logits: torch.Tensor | None
    codec_s: float = 0.0


def _resolve_metric(metric: str, dataset: str | None, num_classes: int) -> str:
    """:func:`~fullgraph.metrics.resolve_metric`, its refusal raised alike by every rank."""
    try:
        return resolve_metric(metric, dataset, num_classes)
    except ConfigError as exc:
        raise mark_replicated(exc) from None


class Trainer(EpochLoop):
    """Trains one rank's part; every rank of the job builds one with the same config.

    Args:
        part: this rank's ``Partition`` (one process: ``whole_graph_part(graph)``).
        comm: the communicator (its size must equal ``part.num_parts``).
        config: the experiment.
        run: the run's I/O (checkpoints, quiet); default: none.
        checkpoints: the checkpoint directory, already opened (locked) by the command line;
            by default one is made from ``run.checkpoint`` (not locked).
        device: where tensors live (checked against the transport).
        precision: the resolved precision policy (the command line's); by default
            ``config.precision`` resolved here on ``device`` (a Python caller).
        hop_cache: where SGC's and SIGN's precomputed hops are kept (the command line's:
            the partition's); ``None``: computed, nothing kept.
    """

    def __init__(
        self,
        part: Partition,
        comm: Communicator,
        config: TrainConfig,
        run: RunOptions | None = None,
        checkpoints: CheckpointDir | None = None,
        device: torch.device | str = "cpu",
        precision: Precision | None = None,
        hop_cache: HopCache | None = None,
    ) -> None:
        super().__init__()
        if comm.size != part.num_parts or comm.rank != part.rank:
            raise ConfigError(
                f"rank {comm.rank} of {comm.size} cannot train part {part.rank} of "
                f"{part.num_parts} parts"
            )
        check_device(str(device), comm.transport)
        self.device = torch.device(device)
        if precision is None:  # a Python caller: ``auto`` decided, support checked
            try:
                precision = resolve_precision(config.precision, self.device.type)[0]
            except ConfigError as exc:
                raise mark_replicated(exc) from None
        config = dataclasses.replace(config, precision=precision.name)
        self.comm, self.config = comm, config
        # Only the hash is kept: the part's arrays that training does not use (its CSR of
        # int64 ids, degrees) are freed once the caller lets the part go as well.
        self.partition_hash = part.partition_hash
        self.run = run or RunOptions()
        self.epochs, self.eval_every, self.quiet = config.epochs, config.eval_every, self.run.quiet
        self.metric = _resolve_metric(config.metric, part.meta.get("dataset"), part.num_classes)
        rank_graph = assemble_rank(part, comm, config, self.device, precision, hop_cache=hop_cache)
        self.data, self.ctx = rank_graph.data, rank_graph.ctx
        if config.sums == "rank-order":  # asked for: no note, the help says what it gives
            self.ctx.blocks = None
        elif self.ctx.blocks is None and comm.rank == 0 and not self.run.quiet:
            print(NO_BLOCKS_NOTE, flush=True)
        self.num_train_global = rank_graph.num_train_global
        #: Correct & Smooth of the evaluation (``--correct-smooth``), or ``None``
        self.smoother: CorrectSmooth | None = None
        params = config.correct_smooth_params()
        if params is not None:  # its sum over nodes in the tree where the run's sums are
            self.smoother = CorrectSmooth(
                symmetric_operator(part, self.device),
                self.ctx.plan,
                self.data["y"],
                self.data["train"],
                self.num_train_global,
                self.ctx.blocks,
                params,
            )
        self.model = self._build_model(part)
        #: a per-row stack's training steps on the training rows alone (``None``: every row)
        self.train_rows = train_rows(self.model, config, self.ctx, self.data)
        self.num_features, self.num_classes = int(part.num_features), int(part.num_classes)
        #: how the model file names the data (the command sets it; default: the partition)
        self.data_label = ""
        self._best_model: dict[str, Any] | None = None
        first = list(self.model.layers[0].parameters())
        first_ids = {id(p) for p in first}
        rest = [p for p in self.model.parameters() if id(p) not in first_ids]
        wd_rest = config.weight_decay if config.weight_decay_scope == "all" else 0.0
        self.optimizer = Adam(
            [
                {"params": first, "weight_decay": config.weight_decay},
                {"params": rest, "weight_decay": wd_rest},
            ],
            lr=config.lr,
        )
        self.checkpoints = checkpoints
        if checkpoints is None and self.run.checkpoint:
            self.checkpoints = CheckpointDir(
                self.run.checkpoint, comm.rank, resume=self.run.resume, force=self.run.force
            )
        self._fail_at = injected_failure_epoch(comm.rank)

    def _build_model(self, part: Partition) -> GNN:
        """The model, seeded, with rank 0's initial parameters broadcast to every rank."""
        cfg = self.config
        torch.manual_seed(cfg.seed)
        model = cfg.build_model(int(part.num_features), int(part.num_classes)).to(self.device)
        flat = parameter_vector(model)
        load_parameter_vector(model, self.comm.broadcast_(flat, root=0))
        return model

    def resolved_config(self) -> dict[str, Any]:
        """The experiment and run I/O in one dict (``config.json``, checkpoints)."""
        return {**self.config.to_dict(), "device": str(self.device), **self.run.to_dict()}

    # -- one step ----------------------------------------------------------------------------
    def train_step(self, epoch: int, keep_logits: bool = True) -> StepResult:
        """Forward with dropout, backward, all-reduce the gradients (and loss), Adam step.

        Args:
            epoch: the epoch (selects the dropout masks).
            keep_logits: return the training logits (else they are let go before the
                backward pass, which does not need them: ``[n, classes]`` less at its peak).
        """
        halo0, red0 = self.comm.wait_s["halo"], self.comm.wait_s["reduce"]
        compression = self.ctx.plan.compression
        codec0 = compression.codec_s if compression is not None else 0.0
        t0 = time.perf_counter()
        self.model.train()
        tree = self.fresh_tree()
        sub = self.train_rows
        x, ctx, y = (
            (self.data["x"], self.ctx, self.data["y"]) if sub is None else (sub.x, sub.ctx, sub.y)
        )
        mask = self.data["train"] if sub is None else sub.mask
        with self.ctx.plan.training_step(epoch), collecting(tree):
            logits = self.model(x, ctx, epoch=epoch, training=True)
            if tree is None:
                loss = F.cross_entropy(logits[mask], y[mask], reduction="sum")
            else:  # per row, summed per block and over the tree (the same bits at any P)
                per_row = F.cross_entropy(logits[mask], y[mask], reduction="none")
                rows = torch.zeros(mask.shape[0], dtype=per_row.dtype, device=per_row.device)
                rows = rows.masked_scatter(mask, per_row)
                tree.add_loss(rows, self.num_train_global)
                loss = per_row.sum()
            loss = loss / self.num_train_global
            if not keep_logits:
                logits = None
            loss.backward()
        global_loss = self.apply_step(loss, epoch, tree)
        return StepResult(
            loss=global_loss,
            seconds=time.perf_counter() - t0,
            comm_s=self.comm.wait_s["halo"] - halo0,
            reduce_s=self.comm.wait_s["reduce"] - red0,
            logits=None if logits is None else logits.detach(),
            codec_s=(compression.codec_s - codec0) if compression is not None else 0.0,
        )

    def train_rows_line(self) -> str:
        """The line saying that the steps run on the training rows alone (collective: every
        rank calls it)."""
        counts = torch.tensor(
            [float(self.train_rows.rows.shape[0]), float(self.data["train"].shape[0])],
            dtype=torch.float64,
        )
        rows, total = (int(v) for v in self.comm.allreduce_(counts, "sum", tag="setup").tolist())
        return (
            f"receptive field: every layer is per row, so training steps run on the "
            f"{rows:,}/{total:,} training rows alone ({rows / max(total, 1):.1%}; --prune off: "
            f"every row)"
        )

    def fresh_tree(self) -> BlockGradients | None:
        """The step's block tree (``None`` without the part's blocks), every gradient cleared
        for it: zeroed without a tree; with one, no ``.grad`` at all (a parameter that gets
        one used autograd besides the block tree)."""
        blocks = self.ctx.blocks  # the training rows' own where the step runs on them alone
        if blocks is not None and self.train_rows is not None:
            blocks = self.train_rows.ctx.blocks
        tree = BlockGradients(blocks) if blocks is not None else None
        if tree is None:
            self.optimizer.zero_grad()
        else:
            for p in self.model.parameters():
                p.grad = None
        return tree

    def apply_step(self, loss: torch.Tensor, epoch: int, tree: BlockGradients | None) -> float:
        """The gradients summed over every rank (through ``tree`` where it holds them), the
        scheduled learning rate, one optimiser step; the global loss."""
        global_loss = reduce_gradients(
            list(self.model.parameters()), loss, self.comm, epoch, "epoch", tree
        )
        cfg = self.config
        self.optimizer.lr = scheduled_lr(cfg.lr, epoch, cfg.epochs, cfg.lr_warmup, cfg.lr_schedule)
        self.optimizer.step()
        return global_loss

    def train_epoch(self, epoch: int) -> EpochStats:
        """One full-batch step (an epoch is one step)."""
        step = self.train_step(epoch, keep_logits=False)
        return EpochStats(
            loss=step.loss,
            seconds=step.seconds,
            comm_s=step.comm_s,
            reduce_s=step.reduce_s,
            codec_s=step.codec_s,
            steps=1,
        )

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Train / val / test :attr:`metric` of the current model (no dropout), over all
        ranks; with Correct & Smooth those of the smoothed scores (which pick the best model)
        and the model's own as ``base_<split>_<metric>``."""
        self.model.eval()
        logits = self.model(self.data["x"], self.ctx, training=False)
        plain = split_metrics(logits, self.data["y"], self.data, self.comm, self.metric)
        if self.smoother is None:
            return plain
        scores = self.smoother(logits)
        smoothed = smoothed_metrics(scores, self.data["y"], self.data, self.comm, self.metric)
        return {**smoothed, **{f"base_{k}": v for k, v in plain.items()}}

    def gather_logits(self, logits: torch.Tensor) -> np.ndarray | None:
        """All ranks' logits in global node order (rank 0 gets them, others ``None``)."""
        pieces = self.comm.allgather_object((self.ctx.global_ids, logits.cpu().numpy()))
        if self.comm.rank != 0:
            return None
        n = sum(len(g) for g, _ in pieces)
        out = np.empty((n, logits.shape[1]), dtype=np.float32)
        for gids, rows in pieces:
            out[gids] = rows
        return out

    # -- the loop's hooks --------------------------------------------------------------------
    def before_epoch(self, epoch: int) -> None:
        """Raise the injected failure of ``FULLGRAPH_FAIL_AT`` (tests of the abort path)."""
        if self._fail_at == epoch:
            raise RuntimeError(f"injected failure (FULLGRAPH_FAIL_AT) at epoch {epoch}")

    def after_epoch(self, epoch: int) -> None:
        """Checkpoint every ``checkpoint_every`` epochs and at the last one; the best model
        file then too (when it changed)."""
        run = self.run
        due = epoch % run.checkpoint_every == 0 or epoch == self.epochs
        if run.checkpoint and due:
            self._checkpoint(epoch)
        if (run.checkpoint and due) or epoch == self.epochs:
            self._save_best_model()

    def on_diverged(self) -> None:
        """A run that diverged still leaves its best model file."""
        self._save_best_model()

    def on_best(self, epoch: int, acc: dict[str, float]) -> None:
        """Rank 0 keeps a CPU copy of the model of the best validation score so far (with
        Correct & Smooth: the best smoothed score; the model's own scores then are kept)."""
        m = self.metric
        base = {k: acc[f"base_{k}_{m}"] for k in ("val", "test") if f"base_{k}_{m}" in acc}
        if base:
            self.history["base_at_best"] = base
        if self.comm.rank != 0 or self.run.model_path() is None:
            return
        info = {"correct_smooth": self._correct_smooth_record()} if base else {}
        self._best_model = model_state(
            self.model,
            self.config,
            self.num_features,
            self.num_classes,
            {
                "epoch": epoch,
                "metric": self.metric,
                "val": acc.get(f"val_{self.metric}"),
                "test": acc.get(f"test_{self.metric}"),
                "data": self.data_label,
                "partition_hash": self.partition_hash,
                **info,
            },
        )

    def _correct_smooth_record(self) -> dict[str, Any]:
        """C&S's parameters and the model's own val and test scores at the best epoch (the
        run's ``val``/``test`` are the smoothed ones)."""
        assert self.smoother is not None
        base = self.history.get("base_at_best", {})
        m = self.metric
        return {
            **self.smoother.params.to_dict(),
            **{f"base_{k}_{m}_at_best": v for k, v in base.items()},
        }

    def _save_best_model(self) -> None:
        """Rank 0 writes the best model kept so far (once per new best)."""
        path = self.run.model_path()
        if self.comm.rank != 0 or path is None or self._best_model is None:
            return
        save_model_file(path, self._best_model)
        self._best_model = None  # written: nothing new to write until the next best

    def record_extra(self, stats: EpochStats, maxes: dict[str, float]) -> dict[str, Any]:
        """Codec time and the compression settings."""
        cfg = self.config
        return {
            "codec_s": maxes["codec_s"],
            "compress_fwd": cfg.compress_fwd,
            "compress_bwd": cfg.compress_bwd,
            "error_feedback": cfg.error_feedback,
        }

    def final_extra(self) -> dict[str, Any]:
        """The compression settings; with Correct & Smooth its record."""
        cfg = self.config
        extra: dict[str, Any] = {
            "compress_fwd": cfg.compress_fwd,
            "compress_bwd": cfg.compress_bwd,
            "error_feedback": cfg.error_feedback,
        }
        if self.smoother is not None:
            extra["correct_smooth"] = self._correct_smooth_record()
        return extra

    # -- checkpoints -------------------------------------------------------------------------
    def resume(self) -> None:
        """Restore model, optimiser, RNG and history from the checkpoint directory.

        Raises:
            ConfigError: no usable checkpoint (missing, corrupted, another run's, or at an
                epoch that leaves nothing to train); raised alike by every rank.
        """
        if self.checkpoints is None:
            raise ConfigError("--resume needs --checkpoint DIR")
        try:
            state = self.checkpoints.load(self.resolved_config(), self.partition_hash)
            self._check_saved(state)
        except ConfigError as exc:
            raise mark_replicated(exc) from None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.history = state["history"]
        self.start_epoch = int(state["epoch"]) + 1
        compression = self.ctx.plan.compression
        if compression is not None and compression.error_feedback:
            mine = self.checkpoints.load_rank_state(int(state["epoch"]))
            compression.residuals = {
                (int(k[0]), int(k[1])): v for k, v in mine["residuals"].items()
            }

    def _check_saved(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint whose weights or optimiser state this model cannot take: names,
        dtypes and shapes as the model's own, no NaN or infinity (one line naming the file and
        the tensor)."""
        where, remedy = self.checkpoints.file, "start over with --force"  # type: ignore[union-attr]
        check_values(state.get("model", {}), self.model.state_dict(), where=where, remedy=remedy)
        check_values(
            named_values(state.get("optimizer", {})),
            named_values(self.optimizer.state_dict()),
            where=where,
            what="optimiser state",
            remedy=remedy,
        )

    def _checkpoint(self, epoch: int) -> None:
        """Write the checkpoint of ``epoch`` (every rank calls this, at the same epoch)."""
        compression = self.ctx.plan.compression
        per_rank = compression is not None and compression.error_feedback
        ckpt = self.checkpoints
        assert ckpt is not None
        if per_rank:  # residuals first: checkpoint.pt must never name an epoch without them
            ckpt.save_rank_state(epoch, {"residuals": dict(compression.residuals)})
            self.comm.barrier()
        if self.comm.rank == 0:
            ckpt.save(
                {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "epoch": epoch,
                    "rng": torch.get_rng_state(),
                    "config": self.resolved_config(),
                    "partition_hash": self.partition_hash,
                    "history": self.history,
                },
            )
        if per_rank:
            self.comm.barrier()  # checkpoint.pt now names this epoch: older residuals can go
            ckpt.remove_rank_states(keep_epoch=epoch)
