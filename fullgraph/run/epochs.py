"""The epoch skeleton shared by the full-batch trainer and the mini-batch baseline.

What the two have in common lives here, so that their comparison is like for like: the
gradient reduction (one fixed-order all-reduce of every gradient and the loss, then a stop on a
non-finite value), accuracy counting over all ranks, the epoch record (:meth:`EpochLoop.
epoch_record`: the slowest rank's split of the epoch, which adds up to the epoch time, and the
maxima over ranks; bytes summed), best-validation tracking by the run's metric (``acc`` or
``rocauc``, see :mod:`fullgraph.run.metrics`), the per-epoch line and JSON object, and the final
record (the median epoch leaves out the first epoch of the process, which carries the start-up,
recorded apart). A trainer derives from :class:`EpochLoop` and supplies only how an epoch trains
(:meth:`EpochLoop.train_epoch`) and how it predicts (:meth:`EpochLoop.evaluate`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.tree_sum import BlockGradients
from fullgraph.errors import TrainingDiverged, mark_replicated
from fullgraph.metrics import METRICS
from fullgraph.resources import peak_rss_mb
from fullgraph.run.log import append_record, write_epoch

SPLITS = ("train", "val", "test")
#: One rank's times of an epoch, in the order of :meth:`EpochLoop.epoch_record`'s table.
TIMES = ("epoch_s", "compute_s", "comm_s", "reduce_s", "eval_s", "sample_s", "codec_s")
#: The parts of one rank's epoch time: they add up to it (``codec_s`` is within ``compute_s``).
SPLIT = ("compute_s", "comm_s", "sample_s", "reduce_s")


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


def reduce_gradients(
    params: list[torch.nn.Parameter],
    loss: torch.Tensor,
    comm: Communicator,
    epoch: int,
    what: str,
    tree: BlockGradients | None = None,
) -> float:
    """Sum every rank's gradients and loss, in place; the global loss.

    Without ``tree`` (or with one that holds nothing) every gradient and the loss go through
    one fixed-order all-reduce (the same bits at a given rank count). With the step's block
    tree, the parameters whose partials it holds and the loss are summed over the fixed
    blocks (:meth:`~fullgraph.distributed.communicator.Communicator.tree_sum_`: the same bits
    at any rank count), a parameter pushed by several calls as their roots added in call order;
    the other parameters keep the all-reduce. A parameter with no gradient gets zeros.

    Args:
        params: the model's parameters (their ``.grad`` is replaced by the sum over ranks).
        loss: this rank's share of the loss (already divided by the global count); unused
            with a tree holding the loss, whose root (the per-block sums of the row losses)
            is divided by the tree's ``loss_divisor`` instead.
        comm: the communicator.
        epoch: the epoch, for the divergence message.
        what: ``epoch`` or ``batch i of epoch``, for the divergence message.
        tree: the step's block tree (:class:`~fullgraph.distributed.tree_sum.BlockGradients`)
            or ``None``.

    Raises:
        TrainingDiverged: the summed loss or a summed gradient is not finite.
    """
    # a tree parameter with a .grad of its own was also used outside a block function
    touched = [p for p in params if tree is not None and tree.holds(p) and p.grad is not None]
    derived = tree.derived_params() if tree is not None else []
    for p in params:
        if p.grad is None and not any(p is q for q in derived):
            p.grad = torch.zeros_like(p)
    if tree is None or tree.loss is None:
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
        comm.allreduce_(flat, "sum", tag="reduce")
        check_finite(flat, epoch, what)
        _write_grads(params, flat)
        return float(flat[-1])
    # a derived parameter's .grad comes from its source's backward after the tree (its own
    # .grad, if autograd gave it one besides, is summed over ranks as any other's)
    stand_ins = tree.stand_ins()
    in_tree = [p for p in [*params, *stand_ins] if tree.holds(p)]
    rest = [p for p in params if not tree.holds(p) and p.grad is not None]
    summed = torch.cat([p.grad.reshape(-1) for p in rest + touched] + [torch.zeros(0)])
    if summed.numel():
        comm.allreduce_(summed, "sum", tag="reduce")
    layout = tree.layout
    root = comm.tree_sum_(tree.nodes(in_tree), layout.labels, layout.num_blocks, key="grad")
    global_loss = root[-1:] / tree.loss_divisor
    grads, offset = [], 0
    for p in in_tree:
        total = tree.global_grad(p)
        total = None if total is None else total.reshape(-1).clone()
        for _ in range(tree.calls(p)):
            piece = root[offset : offset + p.numel()]
            total = piece.clone() if total is None else total.add_(piece)
            offset += p.numel()
        grads.append(total)
    check_finite(torch.cat([summed, *grads, global_loss]), epoch, what)
    _write_grads(rest + touched, summed)
    by_id = {id(p): g for p, g in zip(in_tree, grads, strict=True)}
    for p, g in zip(in_tree, grads, strict=True):
        if any(p is s for s in stand_ins):
            continue
        if p.grad is None:  # a derived parameter with partials of its own too (GIN's W1)
            p.grad = g.view_as(p).clone()
        elif any(p is q for q in touched):
            p.grad.add_(g.view_as(p))
        else:
            p.grad.copy_(g.view_as(p))
    tree.finish_derived(lambda s: by_id.get(id(s)))
    for p in derived:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return float(global_loss[0])


def _write_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy ``flat``'s consecutive pieces into the parameters' ``.grad``."""
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def accuracies(
    pred: torch.Tensor, y: torch.Tensor, masks: dict[str, torch.Tensor], comm: Communicator
) -> dict[str, float]:
    """Train / val / test accuracy over all ranks from this rank's predictions.

    Args:
        pred: predicted classes of this rank's rows.
        y: their labels.
        masks: ``train``/``val``/``test`` boolean masks of the same rows.
        comm: the communicator (one all-reduce of the counts).
    """
    correct = pred == y
    counts = []
    for name in SPLITS:
        m = masks[name]
        counts += [float(correct[m].sum()), float(m.sum())]
    t = comm.allreduce_(torch.tensor(counts, dtype=torch.float64), "sum", tag="metrics")
    return {f"{n}_acc": float(t[2 * i] / max(t[2 * i + 1], 1.0)) for i, n in enumerate(SPLITS)}


@dataclass
class EpochStats:
    """What one epoch's training did on this rank (seconds and counts).

    ``comm_s`` is halo-exchange waiting (full batch), ``sample_s`` neighbour sampling (mini
    batch), ``codec_s`` encoding and decoding compressed halos; ``compute_s`` is the rest.
    """

    loss: float = 0.0
    seconds: float = 0.0
    comm_s: float = 0.0
    reduce_s: float = 0.0
    sample_s: float = 0.0
    codec_s: float = 0.0
    steps: int = 0
    sampled_edges: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class EpochLoop:
    """The epochs of a run: train, evaluate when due, record, log, hook.

    A subclass sets :attr:`comm`, :attr:`epochs`, :attr:`eval_every`, :attr:`quiet`,
    :attr:`metric` (resolved: ``acc`` or ``rocauc``) and implements :meth:`train_epoch` and
    :meth:`evaluate`; it may override :meth:`after_epoch` (checkpoints), :meth:`record_extra`
    and :meth:`final_extra` (its own fields).
    """

    comm: Communicator
    epochs: int
    eval_every: int
    quiet: bool = False
    metric: str = "acc"

    def __init__(self) -> None:
        self.start_epoch = 1
        self.history: dict[str, Any] = {"best_val_acc": -1.0, "test_at_best": 0.0, "epoch_s": []}

    def _track(self) -> str:
        """The history's key of the best validation score, started over when the history (a
        resumed checkpoint's) tracked another metric (``acc`` where it names none)."""
        key = f"best_val_{self.metric}"
        if self.history.get("metric", "acc") != self.metric or key not in self.history:
            for other in METRICS:
                self.history.pop(f"best_val_{other}", None)
            self.history.update({key: -1.0, "test_at_best": 0.0, "best_epoch": None})
        self.history["metric"] = self.metric
        return key

    # -- what a trainer supplies -------------------------------------------------------------
    def train_epoch(self, epoch: int) -> EpochStats:
        """One epoch of training on this rank."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """``train_<metric>``, ``val_<metric>``, ``test_<metric>`` over all ranks (a
        collective)."""
        raise NotImplementedError

    def before_epoch(self, epoch: int) -> None:
        """Called before every epoch (fault injection in tests)."""

    def after_epoch(self, epoch: int) -> None:
        """Called after every epoch is logged (checkpoints)."""

    def on_best(self, epoch: int, acc: dict[str, float]) -> None:
        """Called when an evaluation improves the best validation score (keep the model)."""

    def on_diverged(self) -> None:
        """Called when the run diverged (:class:`~fullgraph.errors.TrainingDiverged`), before
        the error leaves :meth:`fit` (write the best model kept so far)."""

    def record_extra(self, stats: EpochStats, maxes: dict[str, float]) -> dict[str, Any]:
        """Fields of this trainer's epoch record beyond the shared ones."""
        return {}

    def final_extra(self) -> dict[str, Any]:
        """Fields of this trainer's final record beyond the shared ones."""
        return {}

    # -- the skeleton ------------------------------------------------------------------------
    def epoch_record(
        self,
        epoch: int,
        stats: EpochStats,
        acc: dict[str, float],
        eval_s: float,
        bytes0: int,
        halo0: int,
    ) -> dict[str, Any]:
        """The epoch's record (one all-reduce): bytes and samples summed over ranks, and times.

        ``epoch_s`` is the slowest rank's epoch (the maximum over ranks); ``slowest_rank`` is
        that rank (the lowest of a tie) and ``slowest_<part>_s`` its own split, which adds up
        to ``epoch_s``: ``compute + comm + reduce`` (full batch) or ``compute + sample +
        reduce`` (mini batch). ``compute_s``, ``comm_s``, ``reduce_s``, ``eval_s`` and
        ``peak_rss_mb`` are maxima over ranks, each of its own rank, so they need not add up.
        """
        comm = self.comm
        compute_s = stats.seconds - stats.comm_s - stats.sample_s - stats.reduce_s
        local = [stats.seconds, compute_s, stats.comm_s, stats.reduce_s, eval_s, stats.sample_s]
        local += [stats.codec_s, peak_rss_mb()]
        local += [sum(comm.bytes_sent.values()) - bytes0, comm.bytes_sent["halo"] - halo0]
        local.append(stats.sampled_edges)
        # every rank's row, the others zero: the sum is every rank's figures, exact (x + 0 = x)
        table = torch.zeros(comm.size, len(local), dtype=torch.float64)
        table[comm.rank] = torch.tensor(local, dtype=torch.float64)
        comm.allreduce_(table, "sum", tag="metrics")
        top = table.max(dim=0).values
        maxes = {name: float(top[i]) for i, name in enumerate(TIMES)}
        slowest = int(torch.argmax(table[:, 0]))  # the first of equal maxima
        split = {name: float(table[slowest, i]) for i, name in enumerate(TIMES)}
        sums = table[:, len(TIMES) + 1 :].sum(dim=0)  # integers: exact in float64
        rec: dict[str, Any] = {"epoch": epoch, "loss": stats.loss, **acc}
        rec.update({k: maxes[k] for k in ("epoch_s", "compute_s", "comm_s", "reduce_s")})
        rec["eval_s"] = maxes["eval_s"]
        rec["comm_bytes"] = int(sums[0])
        rec["halo_bytes"] = int(sums[1])
        rec["peak_rss_mb"] = round(float(top[len(TIMES)]), 1)
        rec.update(self.record_extra(stats, {**maxes, "sampled_edges": float(sums[2])}))
        rec["slowest_rank"] = slowest
        for name in SPLIT:
            if name != "sample_s" or "sample_s" in rec:  # sampling: where the trainer samples
                rec[f"slowest_{name}"] = split[name]
        if "codec_s" in rec:
            rec["slowest_codec_s"] = split["codec_s"]
        return rec

    def fit(self, log: TextIO | None = None) -> dict[str, Any]:
        """Run the epochs; rank 0 prints a line per epoch and writes JSON lines to ``log``.

        The process's first epoch (``start_epoch``: 1, or the one after a resumed checkpoint)
        carries the start-up (first calls into the kernels, the transport's first messages):
        its record says ``"startup": true``, the final record gives its time apart
        (``startup_epoch_s``) and ``median_epoch_s`` leaves it out (unless it is the only one).

        Args:
            log: an open text file for JSON lines (rank 0), or ``None``.

        Returns:
            The final summary (``best_val_<metric>``, ``test_<metric>`` at the best validation
            epoch, ``metric``, ``median_epoch_s``, ``startup_epoch_s``, ...), the same on every
            rank.

        Raises:
            TrainingDiverged: a non-finite loss or gradient (after :meth:`on_diverged`).
        """
        try:
            return self._epochs(log)
        except TrainingDiverged:
            self.on_diverged()
            raise

    def _epochs(self, log: TextIO | None) -> dict[str, Any]:
        """The epochs of :meth:`fit` and its final record."""
        comm = self.comm
        best, m = self._track(), self.metric
        startup_s = 0.0
        for epoch in range(self.start_epoch, self.epochs + 1):
            self.before_epoch(epoch)
            bytes0, halo0 = sum(comm.bytes_sent.values()), comm.bytes_sent["halo"]
            stats = self.train_epoch(epoch)
            t_eval = time.perf_counter()
            acc = {}
            if epoch % self.eval_every == 0 or epoch == self.epochs:
                acc = self.evaluate()
            eval_s = time.perf_counter() - t_eval
            rec = self.epoch_record(epoch, stats, acc, eval_s, bytes0, halo0)
            if epoch == self.start_epoch:  # the process's first epoch: it carries the start-up
                rec["startup"] = True
                startup_s = rec["epoch_s"]
            else:
                self.history["epoch_s"].append(rec["epoch_s"])
            if acc and acc[f"val_{m}"] > self.history[best]:
                self.history[best] = acc[f"val_{m}"]
                self.history["test_at_best"] = acc[f"test_{m}"]
                self.history["best_epoch"] = epoch
                self.on_best(epoch, acc)
            self.history.setdefault("losses", []).append(stats.loss)
            if comm.rank == 0:
                write_epoch(rec, log, self.quiet)
            self.after_epoch(epoch)
        final = {
            "final": True,
            "epochs": self.epochs,
            best: self.history[best],
            f"test_{m}": self.history["test_at_best"],
            "metric": m,
            "best_epoch": self.history.get("best_epoch"),
            # the start-up epoch alone where it is the only one
            "median_epoch_s": statistics.median(self.history["epoch_s"] or [startup_s]),
            "startup_epoch": self.start_epoch,
            "startup_epoch_s": startup_s,
            "ranks": comm.size,
            "transport": comm.transport,
            **self.final_extra(),
        }
        if comm.rank == 0 and log is not None:
            append_record(final, log)
        return final


def final_line(final: dict[str, Any], threads: int) -> str:
    """The one line both commands print at the end of a run (rank 0)."""
    m = final.get("metric", "acc")
    name = "" if m == "acc" else f"{m} "  # accuracy: the line as it always was
    startup = ""
    if "startup_epoch_s" in final and final["epochs"] > final["startup_epoch"]:
        first = final["startup_epoch_s"]
        took = f"{first:.2f} s" if first >= 1 else f"{first * 1e3:.1f} ms"
        startup = f" (epoch {final['startup_epoch']} left out: {took} with the start-up)"
    return (
        f"final: best val {name}{final[f'best_val_{m}']:.4f} (epoch {final['best_epoch']}), test "
        f"at best val {final[f'test_{m}']:.4f}, median epoch {final['median_epoch_s'] * 1e3:.1f} "
        f"ms{startup}, {final['ranks']} rank(s) x {threads} thread(s)"
    )
