"""The full-batch training loop of one rank: step, evaluation, logging, checkpoints.

All ranks run the same loop on their own part. The loss is the sum over this rank's training
nodes divided by the GLOBAL number of training nodes, so summing the ranks' gradients (one
all-reduce per step) gives exactly the full-graph gradient; parameters start identical (same
seed, then a broadcast from rank 0) and therefore stay identical.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.checkpoint import CheckpointDir
from fullgraph.comm import Communicator
from fullgraph.compression import HaloCompression
from fullgraph.errors import ConfigError, TrainingDiverged, mark_replicated
from fullgraph.halo import HaloPlan, SplitOperator
from fullgraph.local_graph import build_operator, part_tensors
from fullgraph.models import (
    GNN,
    GraphContext,
    load_parameter_vector,
    parameter_vector,
    precompute_first_aggregate,
    sparse_features,
)
from fullgraph.optim import Adam
from fullgraph.resources import peak_rss_mb
from fullgraph.train_config import TrainConfig
from fullgraph.train_log import injected_failure_epoch, write_epoch

__all__ = ["StepResult", "TrainConfig", "Trainer", "check_finite"]


def check_finite(reduced: torch.Tensor, epoch: int, what: str = "epoch") -> None:
    """Stop training when the all-reduced gradients or loss (last entry) are not finite.

    Every rank holds the same reduced vector, so every rank raises alike, before the optimiser
    step and before any checkpoint of this epoch: the last good checkpoint is kept.

    Raises:
        TrainingDiverged: a NaN or infinite loss or gradient.
    """
    if bool(torch.isfinite(reduced).all()):
        return
    loss = float(reduced[-1])
    part = f"the loss is {loss}" if not torch.isfinite(reduced[-1]) else "a gradient is not finite"
    raise mark_replicated(
        TrainingDiverged(
            f"{what} {epoch}: {part}; training stopped before the update (the last checkpoint, "
            f"if any, is kept). Lower --lr, check the features, or resume from the checkpoint"
        )
    )


@dataclass
class StepResult:
    """One optimisation step: global loss, timings (this rank) and the training logits.

    ``codec_s`` is the time spent encoding and decoding compressed halo rows (part of the
    compute time).
    """

    loss: float
    seconds: float
    comm_s: float
    reduce_s: float
    logits: torch.Tensor
    codec_s: float = 0.0


class Trainer:
    """Trains one rank's part; every rank of the job builds one with the same config.

    Args:
        part: this rank's ``Partition`` (one process: ``whole_graph_part(graph)``).
        comm: the communicator (its size must equal ``part.num_parts``).
        config: the run's configuration.
        checkpoints: the checkpoint directory, already opened (locked) by the command line;
            by default one is made from ``config.checkpoint`` (not locked).
    """

    def __init__(
        self,
        part: Any,
        comm: Communicator,
        config: TrainConfig,
        checkpoints: CheckpointDir | None = None,
    ) -> None:
        if comm.size != part.num_parts or comm.rank != part.rank:
            raise ConfigError(
                f"rank {comm.rank} of {comm.size} cannot train part {part.rank} of "
                f"{part.num_parts} parts"
            )
        self.part, self.comm, self.config = part, comm, config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"--device {config.device}, but torch {torch.__version__} sees no CUDA device"
            )
        if comm.transport == "mpi" and self.device.type != "cpu":
            raise ConfigError("transport mpi exchanges host buffers: use --device cpu (or nccl)")
        self.data = part_tensors(part)
        if config.normalize_features:
            self.data["x"] = self._normalize_rows(self.data["x"])
        self.data = {k: v.to(self.device) for k, v in self.data.items()}
        self.num_train_global = int(part.num_train_global)
        op = build_operator(part, config.model)
        self.ctx = GraphContext(
            op=SplitOperator(
                op.inner.to(self.device), None if op.halo is None else op.halo.to(self.device)
            ),
            plan=HaloPlan.from_partition(part, comm),
            global_ids=np.asarray(part.global_ids[: part.num_inner], dtype=np.int64),
            seed=config.seed,
        )
        self.ctx.plan.buffer_bytes = int(config.exchange_buffer_mb * 2**20)
        if config.compressed:
            self.ctx.plan.compression = HaloCompression(
                config.compress_fwd,
                config.compress_bwd,
                seed=config.seed,
                rank=comm.rank,
                error_feedback=config.error_feedback,
            )
        in_drop = config.resolved_input_dropout()
        pre = config.precompute_first
        if pre == "on" and in_drop > 0:
            raise ConfigError("--precompute-first on needs --input-dropout 0")
        if pre == "on" or (pre == "auto" and in_drop == 0):
            self.ctx.first_aggregate = precompute_first_aggregate(self.data["x"], self.ctx)
        self.model = self._build_model(part, in_drop)
        x = self.data["x"]
        stats = torch.tensor([float((x != 0).sum()), float(x.numel())], dtype=torch.float64)
        nnz, total = self.comm.allreduce_(stats, "sum", tag="setup").tolist()
        dims = self.model.dims
        sparse_ok = self.device.type == "cpu" and self.ctx.first_aggregate is None
        if sparse_ok and dims[1] <= dims[0] and nnz < 0.1 * total:
            self.ctx.sparse_x = sparse_features(x)
        first = list(self.model.lin[0].parameters())
        if config.model == "sage":
            first += list(self.model.root[0].parameters())
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
        self.start_epoch = 1
        self.history: dict[str, Any] = {"best_val_acc": -1.0, "test_at_best": 0.0, "epoch_s": []}
        self.checkpoints = checkpoints
        if checkpoints is None and config.checkpoint:
            self.checkpoints = CheckpointDir(
                config.checkpoint, comm.rank, resume=config.resume, force=config.force
            )

    def _build_model(self, part: Any, input_dropout: float) -> GNN:
        """The model, seeded, with rank 0's initial parameters broadcast to every rank."""
        cfg = self.config
        torch.manual_seed(cfg.seed)
        model = GNN(
            cfg.model,
            int(part.num_features),
            cfg.hidden,
            int(part.num_classes),
            cfg.layers,
            cfg.dropout,
            input_dropout,
        )
        model = model.to(self.device)
        flat = parameter_vector(model)
        load_parameter_vector(model, self.comm.broadcast_(flat, root=0))
        return model

    def _normalize_rows(self, x: torch.Tensor) -> torch.Tensor:
        """PyG ``NormalizeFeatures``: subtract the global minimum, divide rows by their sum."""
        local_min = x.min() if x.numel() else torch.tensor(float("inf"))
        neg = torch.tensor([-float(local_min)], dtype=torch.float64)
        global_min = -float(self.comm.allreduce_(neg, "max", tag="setup")[0])
        x = x - global_min
        return x / x.sum(dim=1, keepdim=True).clamp(min=1.0)

    # -- one step ----------------------------------------------------------------------------
    def train_step(self, epoch: int) -> StepResult:
        """Forward with dropout, backward, all-reduce the gradients (and loss), Adam step."""
        halo0, red0 = self.comm.wait_s["halo"], self.comm.wait_s["reduce"]
        compression = self.ctx.plan.compression
        codec0 = compression.codec_s if compression is not None else 0.0
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad()
        with self.ctx.plan.training_step(epoch):
            logits = self.model(self.data["x"], self.ctx, epoch=epoch, training=True)
            mask = self.data["train"]
            loss = F.cross_entropy(logits[mask], self.data["y"][mask], reduction="sum")
            loss = loss / self.num_train_global
            loss.backward()
        params = list(self.model.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
        self.comm.allreduce_(flat, "sum", tag="reduce")
        check_finite(flat, epoch)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self.optimizer.step()
        return StepResult(
            loss=float(flat[-1]),
            seconds=time.perf_counter() - t0,
            comm_s=self.comm.wait_s["halo"] - halo0,
            reduce_s=self.comm.wait_s["reduce"] - red0,
            logits=logits.detach(),
            codec_s=(compression.codec_s - codec0) if compression is not None else 0.0,
        )

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Train / val / test accuracy of the current model (no dropout), over all ranks."""
        self.model.eval()
        pred = self.model(self.data["x"], self.ctx, training=False).argmax(dim=1)
        correct = pred == self.data["y"]
        counts = []
        for name in ("train", "val", "test"):
            m = self.data[name]
            counts += [float(correct[m].sum()), float(m.sum())]
        t = self.comm.allreduce_(torch.tensor(counts, dtype=torch.float64), "sum", tag="metrics")
        return {
            f"{n}_acc": float(t[2 * i] / max(t[2 * i + 1], 1.0))
            for i, n in enumerate(("train", "val", "test"))
        }

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

    # -- the loop ----------------------------------------------------------------------------
    def resume(self) -> None:
        """Restore model, optimiser, RNG and history from the checkpoint directory.

        Raises:
            ConfigError: no usable checkpoint (missing, corrupted, another run's, or at an
                epoch that leaves nothing to train); raised alike by every rank.
        """
        if self.checkpoints is None:
            raise ConfigError("--resume needs --checkpoint DIR")
        try:
            state = self.checkpoints.load(self.config.to_dict(), self.part.partition_hash)
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
                    "config": self.config.to_dict(),
                    "partition_hash": self.part.partition_hash,
                    "history": self.history,
                },
            )
        if per_rank:
            self.comm.barrier()  # checkpoint.pt now names this epoch: older residuals can go
            ckpt.remove_rank_states(keep_epoch=epoch)

    def fit(self, log: Any | None = None) -> dict[str, Any]:
        """Run the epochs; rank 0 prints a line per epoch and writes JSONL to ``log``.

        Args:
            log: an open text file for JSON lines (rank 0), or ``None``.

        Returns:
            The final summary (``best_val_acc``, ``test_acc`` at the best validation epoch,
            ``median_epoch_s``, ...).
        """
        cfg = self.config
        fail_at = injected_failure_epoch(self.comm.rank)
        for epoch in range(self.start_epoch, cfg.epochs + 1):
            if fail_at == epoch:
                raise RuntimeError(f"injected failure (FULLGRAPH_FAIL_AT) at epoch {epoch}")
            bytes0 = sum(self.comm.bytes_sent.values())
            halo_bytes0 = self.comm.bytes_sent["halo"]
            step = self.train_step(epoch)
            t_eval = time.perf_counter()
            acc = {}
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                acc = self.evaluate()
            eval_s = time.perf_counter() - t_eval
            local = torch.tensor(
                [
                    sum(self.comm.bytes_sent.values()) - bytes0,
                    self.comm.bytes_sent["halo"] - halo_bytes0,
                ],
                dtype=torch.float64,
            )
            sums = self.comm.allreduce_(local, "sum", tag="metrics")
            compute_s = step.seconds - step.comm_s - step.reduce_s
            maxes = self.comm.allreduce_(
                torch.tensor(
                    [
                        step.seconds,
                        compute_s,
                        step.comm_s,
                        step.reduce_s,
                        eval_s,
                        peak_rss_mb(),
                        step.codec_s,
                    ],
                    dtype=torch.float64,
                ),
                "max",
                tag="metrics",
            )
            rec = {
                "epoch": epoch,
                "loss": step.loss,
                **acc,
                "epoch_s": float(maxes[0]),
                "compute_s": float(maxes[1]),
                "comm_s": float(maxes[2]),
                "reduce_s": float(maxes[3]),
                "eval_s": float(maxes[4]),
                "comm_bytes": int(sums[0]),
                "halo_bytes": int(sums[1]),
                "peak_rss_mb": round(float(maxes[5]), 1),
                "codec_s": float(maxes[6]),
                "compress_fwd": cfg.compress_fwd,
                "compress_bwd": cfg.compress_bwd,
                "error_feedback": cfg.error_feedback,
            }
            self.history["epoch_s"].append(rec["epoch_s"])
            if acc and acc["val_acc"] > self.history["best_val_acc"]:
                self.history["best_val_acc"] = acc["val_acc"]
                self.history["test_at_best"] = acc["test_acc"]
                self.history["best_epoch"] = epoch
            self.history.setdefault("losses", []).append(step.loss)
            if self.comm.rank == 0:
                write_epoch(rec, log, cfg.quiet)
            if cfg.checkpoint and (epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs):
                self._checkpoint(epoch)
        final = {
            "final": True,
            "epochs": cfg.epochs,
            "best_val_acc": self.history["best_val_acc"],
            "test_acc": self.history["test_at_best"],
            "best_epoch": self.history.get("best_epoch"),
            "median_epoch_s": statistics.median(self.history["epoch_s"] or [0.0]),
            "ranks": self.comm.size,
            "transport": self.comm.transport,
            "compress_fwd": cfg.compress_fwd,
            "compress_bwd": cfg.compress_bwd,
            "error_feedback": cfg.error_feedback,
        }
        if self.comm.rank == 0 and log is not None:
            log.write(json.dumps(final) + "\n")
            log.flush()
        return final
