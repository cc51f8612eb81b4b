"""Data-parallel mini-batch training of GraphSAGE with neighbour sampling (the baseline).

Every rank reads the whole graph (as PyG's multi-GPU examples do); loaded memory-mapped, the
ranks of one machine share its read-only arrays through the page cache. Each epoch the training
nodes are shuffled with ``(seed, epoch)`` into global batches of ``batch_size``; rank ``r``
samples the blocks of its contiguous share of every global batch and computes the loss summed
over its seeds divided by the GLOBAL batch size, so that the sum of the ranks' gradients (one
all-reduce per step through the :class:`~fullgraph.distributed.Communicator`) is the gradient of the
whole batch. Sampling and dropout are keyed by global node ids, so P ranks and one process
compute the same gradients. Evaluation is exact layer-wise full-graph inference with the rows
split over the ranks, each rank holding only its rows of a layer
(:mod:`fullgraph.minibatch.inference`). The epochs, their line and JSON fields are the shared
skeleton of :mod:`fullgraph.run.epochs`. Rank 0 keeps the model of the best validation score
and writes it as ``fullgraph train``'s model file (:mod:`fullgraph.training.model_file`), and
prints a progress line within an epoch every ``progress_every`` seconds.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fullgraph.datasets import Graph
from fullgraph.distributed.communicator import Communicator
from fullgraph.errors import DataError
from fullgraph.metrics import resolve_metric
from fullgraph.minibatch.config import MinibatchConfig
from fullgraph.minibatch.inference import RowOperator, layerwise_inference, row_range
from fullgraph.minibatch.model import block_forward
from fullgraph.minibatch.sampler import NeighborSampler, global_batches, rank_share
from fullgraph.models.gnn import load_parameter_vector, parameter_vector
from fullgraph.precision import Precision, resolve_precision
from fullgraph.run.epochs import EpochLoop, EpochStats, reduce_gradients
from fullgraph.run.metrics import split_metrics
from fullgraph.run.optim import Adam
from fullgraph.training.model_file import model_state, save_model_file


class MinibatchTrainer(EpochLoop):
    """Trains GraphSAGE on sampled blocks; every rank of the job builds one with the same config.

    Args:
        graph: the whole graph (its arrays are only read: they may be memory-mapped and
            shared by the ranks of a machine).
        comm: the communicator.
        config: the run's configuration.
        quiet: no per-epoch or progress lines.
        model_path: where rank 0 writes the best-validation model file, or ``None``.
        progress_every: seconds between rank 0's progress lines within an epoch (0: none).
        data_label: how the model file names the data (``fullgraph predict`` prints it).
        precision: the resolved precision policy (the command line's); by default
            ``config.precision`` resolved here (a Python caller).
    """

    def __init__(
        self,
        graph: Graph,
        comm: Communicator,
        config: MinibatchConfig,
        quiet: bool = False,
        *,
        model_path: Path | None = None,
        progress_every: float = 0.0,
        data_label: str = "",
        precision: Precision | None = None,
    ) -> None:
        super().__init__()
        self.epochs, self.eval_every, self.quiet = config.epochs, config.eval_every, quiet
        self.model_path, self.data_label = model_path, data_label or graph.name
        self.progress_every = 0.0 if quiet else progress_every
        self._best_model: dict[str, Any] | None = None
        if graph.x is None:
            raise DataError(f"{graph.name}: graph has no node features to train on")
        if precision is None:  # a Python caller: ``auto`` decided, support checked
            precision = resolve_precision(config.precision, "cpu")[0]
        self.precision = precision
        self.graph, self.comm = graph, comm
        self.config = dataclasses.replace(config, precision=precision.name)
        self.metric = resolve_metric(config.metric, graph.name, graph.num_classes)
        self.train_nodes = np.flatnonzero(graph.train_mask).astype(np.int64)
        if self.train_nodes.size == 0:
            raise DataError(f"{graph.name}: graph has no training nodes")
        self.sampler = NeighborSampler(graph.indptr, graph.indices, config.fanouts, config.seed)
        self.x = graph.x  # read in place: batches gather their rows
        self.y = torch.from_numpy(np.array(graph.y, dtype=np.int64))
        self.masks = {
            n: torch.from_numpy(np.array(getattr(graph, f"{n}_mask"), dtype=np.bool_))
            for n in ("train", "val", "test")
        }
        self.lo, self.hi = row_range(graph.num_nodes, comm.rank, comm.size)
        self.rows = RowOperator.of(graph.indptr, graph.indices, self.lo, self.hi)
        torch.manual_seed(config.seed)
        self.model_config = config.model_config()  # the model file's config
        self.model = self.model_config.build_model(graph.num_features, graph.num_classes)
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
            x_src = torch.from_numpy(
                np.asarray(self.x[sb.nodes[: sb.blocks[0].num_src]], dtype=np.float32)
            )
            with self.precision.autocast("cpu"):  # bf16-mixed: torch's autocast
                logits = block_forward(
                    self.model,
                    sb.blocks,
                    x_src,
                    sb.nodes,
                    seed=self.config.seed,
                    stream=epoch * 2**20 + index,
                    training=True,
                ).float()
            y = self.y.index_select(0, torch.from_numpy(sb.seeds))
            loss_sum = F.cross_entropy(logits, y, reduction="sum")
            (loss_sum / batch.size).backward()
        r0 = self.comm.wait_s["reduce"]
        params = list(self.model.parameters())
        total = reduce_gradients(params, loss_sum, self.comm, epoch, f"batch {index} of epoch")
        stats.reduce_s = self.comm.wait_s["reduce"] - r0
        stats.seconds = time.perf_counter() - t0
        return total / batch.size, stats

    def train_epoch(self, epoch: int) -> EpochStats:
        """All global batches of ``epoch``: gradient, all-reduce, Adam step."""
        total = EpochStats()
        batches = global_batches(self.train_nodes, self.config.batch_size, self.config.seed, epoch)
        start = last = time.perf_counter()
        seen = 0
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
            seen += batch.size
            now = time.perf_counter()
            due = self.progress_every > 0 and now - last >= self.progress_every
            if due and index + 1 < len(batches) and self.comm.rank == 0:
                last = now
                mean_loss = total.loss * self.train_nodes.size / seen
                print(
                    progress_line(epoch, index + 1, len(batches), now - start, mean_loss),
                    flush=True,
                )
        return total

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Train / val / test :attr:`metric` from layer-wise full-graph inference, over all
        ranks."""
        self.model.eval()
        # float32 at any --precision: the layer-wise pass writes into float32 buffers in place
        logits = layerwise_inference(self.model, self.rows, self.x, self.comm)
        rows = slice(self.lo, self.hi)
        masks = {name: m[rows] for name, m in self.masks.items()}
        return split_metrics(logits, self.y[rows], masks, self.comm, self.metric)

    def record_extra(self, stats: EpochStats, maxes: dict[str, float]) -> dict[str, Any]:
        """Sampling time, sampled edges (summed over ranks) and steps."""
        return {
            "sample_s": maxes["sample_s"],
            "sampled_edges": int(maxes["sampled_edges"]),
            "steps": stats.steps,
        }

    # -- the best model ----------------------------------------------------------------------
    def on_best(self, epoch: int, acc: dict[str, float]) -> None:
        """Rank 0 keeps a CPU copy of the model of the best validation score so far."""
        if self.comm.rank != 0 or self.model_path is None:
            return
        m = self.metric
        info = {
            "epoch": epoch,
            "metric": m,
            "val": acc.get(f"val_{m}"),
            "test": acc.get(f"test_{m}"),
            "data": self.data_label,
        }
        self._best_model = model_state(
            self.model, self.model_config, self.graph.num_features, self.graph.num_classes, info
        )

    def after_epoch(self, epoch: int) -> None:
        """The best model file, written after the last epoch."""
        if epoch == self.epochs:
            self._save_best_model()

    def on_diverged(self) -> None:
        """A run that diverged still leaves its best model file."""
        self._save_best_model()

    def _save_best_model(self) -> None:
        if self.comm.rank == 0 and self.model_path is not None and self._best_model is not None:
            save_model_file(self.model_path, self._best_model)
            self._best_model = None


def progress_line(epoch: int, done: int, batches: int, seconds: float, loss: float) -> str:
    """Rank 0's line within an epoch: ``epoch 3: batch 120/400, 30.1 s, loss 1.2345 so far,
    ~70 s left``."""
    left = seconds * (batches - done) / max(done, 1)
    return (
        f"epoch {epoch:4d}: batch {done}/{batches}, {seconds:.1f} s, loss {loss:.4f} so far, "
        f"~{left:.0f} s left"
    )
