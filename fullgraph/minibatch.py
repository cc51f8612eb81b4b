"""Data-parallel mini-batch training of GraphSAGE with neighbour sampling (the baseline).

Every rank holds the whole graph (as PyG's multi-GPU examples do). Each epoch the training
nodes are shuffled with ``(seed, epoch)`` into global batches of ``batch_size``; rank ``r``
samples the blocks of its contiguous share of every global batch and computes the loss summed
over its seeds divided by the GLOBAL batch size, so that the sum of the ranks' gradients (one
all-reduce per step through the :class:`~fullgraph.comm.Communicator`) is the gradient of the
whole batch. Sampling and dropout are keyed by global node ids, so P ranks and one process
compute the same gradients. Evaluation is layer-wise full-graph inference with the rows split
over the ranks. The per-epoch line and JSON fields match ``fullgraph train``.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.comm import Communicator
from fullgraph.datasets import Graph
from fullgraph.errors import ConfigError, DataError
from fullgraph.minibatch_model import block_forward, layerwise_inference, row_range, rows_operator
from fullgraph.models import GNN, load_parameter_vector, parameter_vector
from fullgraph.optim import Adam
from fullgraph.option_checks import check_number, check_probability
from fullgraph.resources import peak_rss_mb
from fullgraph.sampler import NeighborSampler, global_batches, rank_share
from fullgraph.train_config import InputDropoutConfig
from fullgraph.train_log import write_epoch
from fullgraph.trainer import check_finite


@dataclass
class MinibatchConfig(InputDropoutConfig):
    """Everything that defines a mini-batch run (``fanouts[0]`` applies to the seeds)."""

    fanouts: list[int] = field(default_factory=lambda: [15, 10, 5])
    batch_size: int = 1024
    hidden: int = 256
    dropout: float = 0.5
    input_dropout: float | None = None  # None: same as dropout
    lr: float = 0.003
    weight_decay: float = 0.0
    epochs: int = 20
    seed: int = 0
    eval_every: int = 1
    quiet: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_size", "hidden", "epochs", "eval_every"):
            check_number(f"--{name.replace('_', '-')}", getattr(self, name), low=1, integer=True)
        check_number("--seed", self.seed, low=0, high=2**63 - 1, integer=True)
        check_number("--lr", self.lr, low=0.0, low_open=True)
        check_number("--weight-decay", self.weight_decay, low=0.0)
        check_probability("--dropout", self.dropout)
        check_probability("--input-dropout", self.input_dropout, optional=True)
        if not self.fanouts or any(f == 0 or f < -1 for f in self.fanouts):
            raise ConfigError(
                f"--fanouts needs positive counts (or -1 for all), got {self.fanouts}"
            )


@dataclass
class EpochStats:
    """Timings and counts of one epoch's steps on this rank."""

    loss: float = 0.0
    seconds: float = 0.0
    sample_s: float = 0.0
    reduce_s: float = 0.0
    steps: int = 0
    sampled_edges: int = 0


class MinibatchTrainer:
    """Trains GraphSAGE on sampled blocks; every rank of the job builds one with the same config.

    Args:
        graph: the whole graph (every rank holds a copy).
        comm: the communicator.
        config: the run's configuration.
    """

    def __init__(self, graph: Graph, comm: Communicator, config: MinibatchConfig) -> None:
        if graph.x is None:
            raise DataError(f"{graph.name}: graph has no node features to train on")
        self.graph, self.comm, self.config = graph, comm, config
        self.train_nodes = np.flatnonzero(graph.train_mask).astype(np.int64)
        if self.train_nodes.size == 0:
            raise DataError(f"{graph.name}: graph has no training nodes")
        self.sampler = NeighborSampler(graph.indptr, graph.indices, config.fanouts, config.seed)
        self.x = torch.from_numpy(np.ascontiguousarray(graph.x, dtype=np.float32))
        self.y = torch.from_numpy(graph.y.astype(np.int64))
        self.masks = {
            n: torch.from_numpy(getattr(graph, f"{n}_mask")) for n in ("train", "val", "test")
        }
        self.lo, self.hi = row_range(graph.num_nodes, comm.rank, comm.size)
        self.a_rows = rows_operator(graph.indptr, graph.indices, self.lo, self.hi)
        torch.manual_seed(config.seed)
        self.model = GNN(
            "sage",
            graph.num_features,
            config.hidden,
            graph.num_classes,
            len(config.fanouts),
            config.dropout,
            config.resolved_input_dropout(),
        )
        flat = parameter_vector(self.model)
        load_parameter_vector(self.model, comm.broadcast_(flat, root=0))
        self.optimizer = Adam(
            [{"params": self.model.parameters(), "weight_decay": config.weight_decay}],
            lr=config.lr,
        )

    # -- one step ----------------------------------------------------------------------------
    def gradient(self, epoch: int, index: int, batch: np.ndarray) -> tuple[float, EpochStats]:
        """Forward and backward of global batch ``index``; gradients all-reduced into ``.grad``.

        Args:
            epoch: the epoch (sampling and dropout key).
            index: the global batch number within the epoch (sampling and dropout key).
            batch: the global batch (this rank takes its share).

        Returns:
            The global mean loss of the batch and this step's timings.
        """
        stats = EpochStats()
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad()
        seeds = rank_share(batch, self.comm.rank, self.comm.size)
        loss_sum = torch.zeros(())
        if seeds.size:
            sb = self.sampler.sample(seeds, epoch=epoch, batch=index)
            stats.sample_s = time.perf_counter() - t0
            stats.sampled_edges = sb.num_sampled_edges
            x_src = self.x.index_select(0, torch.from_numpy(sb.nodes[: sb.blocks[0].num_src]))
            logits = block_forward(
                self.model,
                sb.blocks,
                x_src,
                sb.nodes,
                seed=self.config.seed,
                stream=epoch * 2**20 + index,
                training=True,
            )
            y = self.y.index_select(0, torch.from_numpy(sb.seeds))
            loss_sum = F.cross_entropy(logits, y, reduction="sum")
            (loss_sum / batch.size).backward()
        params = list(self.model.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss_sum.detach().reshape(1)])
        r0 = self.comm.wait_s["reduce"]
        self.comm.allreduce_(flat, "sum", tag="reduce")
        check_finite(flat, epoch, f"batch {index} of epoch")
        stats.reduce_s = self.comm.wait_s["reduce"] - r0
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        stats.seconds = time.perf_counter() - t0
        return float(flat[-1]) / batch.size, stats

    def train_epoch(self, epoch: int) -> EpochStats:
        """All global batches of ``epoch``: gradient, all-reduce, Adam step."""
        total = EpochStats()
        batches = global_batches(self.train_nodes, self.config.batch_size, self.config.seed, epoch)
        for index, batch in enumerate(batches):
            loss, s = self.gradient(epoch, index, batch)
            t0 = time.perf_counter()
            self.optimizer.step()
            total.seconds += s.seconds + time.perf_counter() - t0
            total.loss += loss * batch.size / self.train_nodes.size
            total.sample_s += s.sample_s
            total.reduce_s += s.reduce_s
            total.sampled_edges += s.sampled_edges
            total.steps += 1
        return total

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Train / val / test accuracy from layer-wise full-graph inference, over all ranks."""
        self.model.eval()
        pred = layerwise_inference(self.model, self.a_rows, self.x, self.comm).argmax(dim=1)
        correct = pred == self.y[self.lo : self.hi]
        counts = []
        for name in ("train", "val", "test"):
            m = self.masks[name][self.lo : self.hi]
            counts += [float(correct[m].sum()), float(m.sum())]
        t = self.comm.allreduce_(torch.tensor(counts, dtype=torch.float64), "sum", tag="metrics")
        return {
            f"{n}_acc": float(t[2 * i] / max(t[2 * i + 1], 1.0))
            for i, n in enumerate(("train", "val", "test"))
        }

    # -- the loop ----------------------------------------------------------------------------
    def fit(self, log: Any | None = None) -> dict[str, Any]:
        """Run the epochs; rank 0 prints a line per epoch and writes JSON lines to ``log``.

        Args:
            log: an open text file for JSON lines (rank 0), or ``None``.

        Returns:
            The final summary (``best_val_acc``, ``test_acc`` at the best validation epoch,
            ``median_epoch_s``, ...), the same on every rank.
        """
        cfg = self.config
        best_val, test_at_best, best_epoch = -1.0, 0.0, None
        epoch_times: list[float] = []
        for epoch in range(1, cfg.epochs + 1):
            bytes0 = sum(self.comm.bytes_sent.values())
            st = self.train_epoch(epoch)
            t_eval = time.perf_counter()
            acc = self.evaluate() if epoch % cfg.eval_every == 0 or epoch == cfg.epochs else {}
            eval_s = time.perf_counter() - t_eval
            sums = self.comm.allreduce_(
                torch.tensor(
                    [sum(self.comm.bytes_sent.values()) - bytes0, st.sampled_edges],
                    dtype=torch.float64,
                ),
                "sum",
                tag="metrics",
            )
            compute_s = st.seconds - st.sample_s - st.reduce_s
            maxes = self.comm.allreduce_(
                torch.tensor(
                    [st.seconds, compute_s, st.reduce_s, eval_s, st.sample_s, peak_rss_mb()],
                    dtype=torch.float64,
                ),
                "max",
                tag="metrics",
            )
            rec = {
                "epoch": epoch,
                "loss": st.loss,
                **acc,
                "epoch_s": float(maxes[0]),
                "compute_s": float(maxes[1]),
                "comm_s": 0.0,
                "reduce_s": float(maxes[2]),
                "eval_s": float(maxes[3]),
                "sample_s": float(maxes[4]),
                "comm_bytes": int(sums[0]),
                "halo_bytes": 0,
                "sampled_edges": int(sums[1]),
                "steps": st.steps,
                "peak_rss_mb": round(float(maxes[5]), 1),
            }
            epoch_times.append(rec["epoch_s"])
            if acc and acc["val_acc"] > best_val:
                best_val, test_at_best, best_epoch = acc["val_acc"], acc["test_acc"], epoch
            if self.comm.rank == 0:
                write_epoch(rec, log, cfg.quiet)
        final = {
            "final": True,
            "epochs": cfg.epochs,
            "best_val_acc": best_val,
            "test_acc": test_at_best,
            "best_epoch": best_epoch,
            "median_epoch_s": statistics.median(epoch_times),
            "ranks": self.comm.size,
            "transport": self.comm.transport,
        }
        if self.comm.rank == 0 and log is not None:
            log.write(json.dumps(final) + "\n")
            log.flush()
        return final
