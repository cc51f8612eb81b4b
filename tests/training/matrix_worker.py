"""Worker of ``tests/training/test_bitwise_matrix.py``, run by :func:`harness.run_task`.

``matrix --parts DIR --specs S... --work DIR``: for each model spec
(:func:`bitwise_worker.parse_spec`) on this rank's part:

- trains :data:`EPOCHS` epochs (or the spec's ``epochs``) step by step: every epoch's loss,
  the parameters, the optimiser's state (Adam's moments and step counts) and the buffers
  (norms' running statistics) at the end;
- predicts with the trained model (evaluation mode, the forward ``fullgraph predict`` runs):
  the hidden layer's embeddings and the logits of every node, in global node order;
- trains again through :meth:`~fullgraph.training.trainer.Trainer.fit` with checkpoints every
  :data:`CHECKPOINT_EVERY` epochs, every rank stopped by a failure at epoch
  ``CHECKPOINT_EVERY + 1``, and resumes a new trainer from the checkpoint to the end: the
  resumed run's final parameters.

Rank 0 saves them in an ``.npz`` keyed ``spec/what``. The test runs the same function in
process on the whole graph for the reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from bitwise_worker import parse_spec
from harness import Tasks, communicators, main

EPOCHS = 6
CHECKPOINT_EVERY = 3


def _config(spec: str) -> Any:
    from fullgraph.training import TrainConfig

    kind, variant, overrides = parse_spec(spec)
    if variant:
        raise ValueError(f"matrix: spec {spec!r} has a variant ({variant}); none is known here")
    settings: dict[str, Any] = dict(
        model=kind, layers=2, hidden=16, dropout=0.5, epochs=EPOCHS, seed=3, lr=0.05
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def _optimizer_state(optimizer: Any) -> np.ndarray:
    """Adam's moments and step counts, flattened (``fullgraph.run.optim.Adam.state_dict``)."""
    import torch

    state = optimizer.state_dict()
    pieces = [
        t.detach().reshape(-1).double()
        for key in ("exp_avg", "exp_avg_sq", "steps")
        for t in state[key]
    ]
    return torch.cat(pieces).numpy() if pieces else np.zeros(0)


def _buffers(model: Any) -> np.ndarray:
    """The model's float buffers (running statistics) flattened, in ``named_buffers`` order."""
    import torch

    pieces = [
        b.detach().reshape(-1).double() for _, b in model.named_buffers() if b.is_floating_point()
    ]
    return torch.cat(pieces).numpy() if pieces else np.zeros(0)


def _in_global_order(trainer: Any, rows: Any) -> np.ndarray | None:
    """``rows`` (this rank's) of every rank, in global node order (rank 0; else ``None``)."""
    return trainer.gather_logits(rows.float())


def run_specs(part: Any, comm: Any, specs: list[str], work: Path) -> dict[str, np.ndarray]:
    """The figures of every spec on this rank's part (rank 0's hold the gathered rows)."""
    import torch

    from fullgraph.models.gnn import parameter_vector
    from fullgraph.training import RunOptions, Trainer

    out: dict[str, np.ndarray] = {}
    for index, spec in enumerate(specs):
        cfg = _config(spec)
        tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
        out[f"{spec}/blocks"] = np.asarray(tr.ctx.blocks is not None)
        out[f"{spec}/losses"] = np.asarray(
            [tr.train_step(epoch).loss for epoch in range(1, cfg.epochs + 1)]
        )
        out[f"{spec}/params"] = parameter_vector(tr.model).numpy().copy()
        out[f"{spec}/optimizer"] = _optimizer_state(tr.optimizer)
        out[f"{spec}/buffers"] = _buffers(tr.model)
        layers: dict[int, torch.Tensor] = {}

        def keep(k: int, h: torch.Tensor, layers: dict[int, torch.Tensor] = layers) -> None:
            layers.setdefault(k, h.clone())

        tr.model.eval()
        with torch.no_grad():
            logits = tr.model(tr.data["x"], tr.ctx, training=False, on_layer=keep)
        for name, rows in (("embeddings", layers[1]), ("logits", logits)):
            gathered = _in_global_order(tr, rows)
            if gathered is not None:
                out[f"{spec}/{name}"] = gathered
        # checkpoint, every rank stopped at the same epoch, resume in a new trainer
        checkpoint = work / f"checkpoint-{index}"
        run = RunOptions(quiet=True, checkpoint=str(checkpoint), checkpoint_every=CHECKPOINT_EVERY)
        first = Trainer(part, comm, cfg, run)
        first._fail_at = CHECKPOINT_EVERY + 1
        try:
            first.fit()
        except RuntimeError as exc:
            if "injected failure" not in str(exc):
                raise
        else:
            raise AssertionError("the first run was not stopped")
        first.checkpoints.close()
        del first
        again = RunOptions(
            quiet=True, checkpoint=str(checkpoint), checkpoint_every=CHECKPOINT_EVERY, resume=True
        )
        resumed = Trainer(part, comm, cfg, again)
        resumed.resume()
        resumed.fit()
        out[f"{spec}/resumed"] = parameter_vector(resumed.model).numpy().copy()
        out[f"{spec}/resumed_from"] = np.asarray(resumed.start_epoch)
    return out


TASKS = Tasks()


@TASKS.task
def matrix(
    *, parts: Path, specs: list[str], work: Path, transports: list[str]
) -> dict[str, np.ndarray]:
    """:func:`run_specs` on this rank's part over each transport."""
    from fullgraph.partition import load_partition

    result: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        mine = work / transport
        mine.mkdir(parents=True, exist_ok=True)
        got = run_specs(load_partition(parts, comm.rank), comm, specs, mine)
        result.update({f"{transport}/{k}": v for k, v in got.items()})
    return result


if __name__ == "__main__":
    sys.exit(main(TASKS))
