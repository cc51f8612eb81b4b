"""Worker of ``tests/training/test_bitwise.py``, run by :func:`harness.run_task`.

``bitwise --parts DIR --transports T... --models M...``: trains each model (2 layers, dropout
on) for :data:`EPOCHS` epochs over each transport and saves (rank 0, ``.npz``) the loss of
every epoch, the parameters and the buffers (BatchNorm's running statistics) at the end, and
whether the part carried fixed node blocks (the block tree was used). The test calls
:func:`train_models` in-process on the whole graph for the reference.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from harness import Tasks, communicators, main

EPOCHS = 5


def parse_spec(model: str) -> tuple[str, str, dict[str, Any]]:
    """``KIND[:VARIANT][;KEY=VALUE...]`` -> (kind, variant, TrainConfig overrides); a value
    is read as an int, a float, ``true``/``false`` or else kept as a string (``gcn;norm=batch;
    residual=true``, ``sage;aggr=max``, ``gcn:rank-order``)."""
    head, *pairs = model.split(";")
    kind, _, variant = head.partition(":")
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        value: Any = text
        if text in ("true", "false"):
            value = text == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(text)
                    break
                except ValueError:
                    pass
        overrides[key] = value
    return kind, variant, overrides


def train_models(part: Any, comm: Any, models: list[str]) -> dict[str, np.ndarray]:
    """Losses, final parameters and buffers and the blocks flag of each model, keyed
    ``model/...`` (:func:`parse_spec`: ``KIND[:VARIANT][;KEY=VALUE...]``, the values
    overriding the config); a model named ``KIND:rank-order`` trains without the block tree
    (the sums over nodes in rank order, as a partition without blocks: the negative control),
    ``KIND:norm-rank-order`` with only the norm's sums in rank order (its control),
    ``KIND:composed`` with ``--norm batch`` as three operations (BatchNorm, ReLU, dropout:
    the path of other devices and dtypes) instead of the fused CPU kernels,
    ``gat:attention-rank-order`` with GAT's source gradients as before (halo gradients sent
    back and added on the owners in rank order: :class:`RankOrderAttention`; its control)."""
    import torch

    from fullgraph.models import batch_norm_relu, norm
    from fullgraph.models.gnn import parameter_vector
    from fullgraph.models.layers import gat
    from fullgraph.training import RunOptions, TrainConfig, Trainer

    out: dict[str, np.ndarray] = {}
    for model in models:
        kind, variant, overrides = parse_spec(model)
        settings: dict[str, Any] = dict(
            model=kind, layers=2, hidden=16, dropout=0.5, epochs=EPOCHS, seed=3, lr=0.05
        )
        settings.update(overrides)
        cfg = TrainConfig(**settings)
        tr = Trainer(part, comm, cfg, RunOptions(quiet=True))
        if variant == "rank-order":
            tr.ctx.blocks = None
        with contextlib.ExitStack() as stack:
            if variant == "composed":
                stack.enter_context(mock.patch.object(batch_norm_relu, "fused_path", _never))
            if variant == "norm-rank-order":
                for module in (norm, batch_norm_relu):
                    stack.enter_context(mock.patch.object(module, "norm_tree", _no_tree))
            if variant == "attention-rank-order":
                stack.enter_context(mock.patch.object(gat, "OrderedAttention", RankOrderAttention))
            losses = [tr.train_step(epoch).loss for epoch in range(1, EPOCHS + 1)]
        out[f"{model}/losses"] = np.asarray(losses)
        out[f"{model}/params"] = parameter_vector(tr.model).numpy().copy()
        buffers = [b.reshape(-1).double() for _, b in tr.model.named_buffers()]
        out[f"{model}/buffers"] = torch.cat([torch.zeros(0, dtype=torch.float64), *buffers]).numpy()
        out[f"{model}/blocks"] = np.asarray(tr.ctx.blocks is not None)
    return out


def _never(x: Any) -> bool:
    """A stand-in for ``batch_norm_relu.fused_path``: never fused."""
    return False


def _no_tree(rows: int, *params: Any) -> None:
    """A stand-in for ``norm.norm_tree``: the norm's sums in rank order."""
    return None


class RankOrderAttention:
    """A stand-in for ``gat.OrderedAttention``: the attention kernel over ``[inner; halo]``,
    the halo rows exchanged again with autograd so their gradients go back to the owners and
    are added there in rank order (the previous backward); the parameters still take the
    block tree."""

    @staticmethod
    def apply(inner: Any, halo: Any, graph: Any, structure: Any, plan: Any, *args: Any) -> Any:
        import torch

        from fullgraph.distributed.halo import HaloExchange
        from fullgraph.kernels.edge_attention import edge_attention

        _, heads, width, keys, p, slope = args
        sent = heads * (width + 1)
        rows = inner[:, :sent]
        if halo is not None:
            rows = torch.cat([rows, HaloExchange.apply(rows, plan)])
        return edge_attention(
            rows, inner[:, sent:], graph, heads=heads, width=width, slope=slope, p=p, keys=keys
        )


TASKS = Tasks()


@TASKS.task
def bitwise(*, parts: Path, transports: list[str], models: list[str]) -> dict[str, np.ndarray]:
    """:func:`train_models` over each transport."""
    from fullgraph.partition import load_partition

    result: dict[str, np.ndarray] = {}
    for transport, comm in communicators(transports):
        got = train_models(load_partition(parts, comm.rank), comm, models)
        result.update({f"{transport}/{k}": v for k, v in got.items()})
    return result


if __name__ == "__main__":
    sys.exit(main(TASKS))
