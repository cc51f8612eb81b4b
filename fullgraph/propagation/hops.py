"""The hops of a fixed operator over the whole graph: ``[X, A X, ..., A^K X]``, exact on P ranks.

Every hop is one :class:`~fullgraph.distributed.halo.HaloAggregate` of the previous hop: the
halo rows come from their owners and every row is summed in ascending global id of its
sources, so P ranks give one process's bits (``torch.equal``), hop after hop. The exchanges go
as float32 whatever the run's precision (the plan at float32: a bf16-mixed run rounds the
finished hops once, as its first layer reads them, never a hop before the next is taken).

``ppr`` is personalised-PageRank diffusion on GCN's operator ``Â``:
``X_k = (1 - alpha) Â X_(k-1) + alpha X`` (PyG's ``APPNP`` propagation: the product scaled,
then ``alpha X`` added), ``X_0 = X``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from fullgraph.distributed.halo import HaloAggregate, HaloPlan, SplitOperator
from fullgraph.errors import ConfigError
from fullgraph.precision import FLOAT32

#: What :func:`propagate_hops` keeps: every hop, or ``A^K X`` alone.
KEEPS = ("all", "last")

#: ``progress(k, K, seconds, halo_bytes)`` after hop ``k`` of ``K``: its wall time on this rank
#: and the halo bytes every rank sent for it together.
HopProgress = Callable[[int, int, float, int], None]


def hop_width(keep: str, hops: int, num_features: int) -> int:
    """Columns of the hops :func:`propagate_hops` writes into ``out``: ``(K + 1) F`` for
    ``all``, ``F`` for ``last``."""
    return (hops + 1) * num_features if keep == "all" else num_features


def propagate_hops(
    x: torch.Tensor,
    op: SplitOperator,
    plan: HaloPlan,
    hops: int,
    *,
    propagation: str = "gcn",
    alpha: float | None = None,
    progress: HopProgress | None = None,
    keep: str = "all",
    out: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """``[X, A X, ..., A^K X]`` over this rank's rows (a collective: every rank calls it).

    Args:
        x: the input rows of the inner nodes, float32 [n, F].
        op: the operator (:func:`~fullgraph.propagation.operators.propagation_operator`;
            ``gcn``'s for ``ppr``).
        plan: the rank's halo plan (its exchanges run as float32 here).
        hops: ``K >= 1``.
        propagation: ``ppr`` for personalised-PageRank diffusion, anything else for plain
            powers of ``op`` (the name only says which).
        alpha: ``ppr``'s teleport probability in (0, 1].
        progress: called on every rank after every hop (see :data:`HopProgress`); it may
            print, never run a collective.
        keep: ``all`` (every hop) or ``last`` (``A^K X`` alone; earlier hops are let go as
            the next one is made).
        out: a float32 [n, :func:`hop_width`] buffer to write the kept hops into, hop ``k``
            at columns ``k F .. (k + 1) F`` (``all``); the result then holds views of it.

    Returns:
        ``all``: the ``K + 1`` hops, ``X`` first (``x`` itself unless ``out`` is given);
        ``last``: ``[A^K X]``.

    Raises:
        ConfigError: ``hops < 1``, ``keep`` unknown, or ``ppr`` without ``alpha`` in (0, 1].
    """
    if hops < 1:
        raise ConfigError(f"--hops must be at least 1, not {hops}")
    if keep not in KEEPS:
        raise ConfigError(f"keep must be one of {', '.join(KEEPS)}, not {keep!r}")
    ppr = propagation == "ppr"
    if ppr and (alpha is None or not 0.0 < alpha <= 1.0):
        raise ConfigError(f"--propagation ppr needs --alpha in (0, 1], not {alpha}")
    plan = plan.with_precision(FLOAT32)  # exact float32 hops whatever the run trains in
    comm, width = plan.comm, int(x.shape[1])
    with torch.no_grad():
        x = x.to(torch.float32).contiguous()
        kept: list[torch.Tensor] = []

        def keep_hop(k: int, h: torch.Tensor) -> None:
            if keep == "last" and k < hops:
                return
            if out is None:
                kept.append(h)
                return
            col = k * width if keep == "all" else 0
            view = out[:, col : col + width]
            view.copy_(h)
            kept.append(view)

        keep_hop(0, x)
        teleport = alpha * x if ppr else None  # PyG's ``alpha * h``, once
        h = x
        for k in range(1, hops + 1):
            t0, sent0 = time.perf_counter(), comm.bytes_sent["halo"]
            y = HaloAggregate.apply(h, op, plan)
            if teleport is not None:
                y.mul_(1.0 - alpha).add_(teleport)  # (1 - alpha) A h, then + alpha X
            seconds = time.perf_counter() - t0
            sent = comm.bytes_sent["halo"] - sent0
            if comm.size > 1:  # every rank's bytes of this hop (one number)
                total = torch.tensor([float(sent)], dtype=torch.float64)
                sent = int(comm.allreduce_(total, "sum", tag="setup")[0])
            keep_hop(k, y)
            h = y
            if progress is not None:
                progress(k, hops, seconds, sent)
        return kept
