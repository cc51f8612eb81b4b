"""The link model: the epoch time a halo codec would take on a network, projected from one node.

From a run of P ranks on one node (shared memory) we know, per training step, the compute
time of the fp32 step (step minus the time blocked in exchanges and reductions), the codec's
encode/decode time and the bytes every rank sends to every other rank. The models:

- ``v0`` (docs/compression.md until the measurement of bench/multinode_compress.py):
  ``T = compute_fp32 + codec + max_rank_bytes / B``: the busiest rank's bytes at the nominal
  link rate, every byte on the link, no overlap credited.
- ``v1`` (after that measurement, docs/compression.md): what the measurement showed v0 to miss.
  ``T = compute_fp32 + codec + blocked_1 + node_bytes / B_measured + exchanges * rtt``:
  (1) the time ranks already block in exchanges on one node (``blocked_1``: waiting for the
  slowest rank, not moving bytes: 0.3-1.4 s a step here, as much as a 1 Gbit/s link's transfer)
  stays on a network, v0 subtracted it; (2) the bytes that cross a node's link are all its
  ranks' bytes to other nodes, in or out, whichever is more (a node of 2 ranks carries both
  ranks' traffic; traffic inside a node does not cross it), not one rank's bytes to every
  peer; (3) the link's rate is what a TCP stream achieves, not the nominal rate (25 Gbit/s
  links carried 3-12 Gbit/s here: the network stack runs on the same two cores); (4) one round
  trip per all-to-all.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkRun:
    """What a one-node run tells the model about one codec.

    Attributes:
        compute_s: the fp32 step's time outside exchanges and reductions (max over ranks).
        codec_s: this codec's encode + decode time per step (max over ranks).
        max_rank_bytes: bytes the busiest rank sends to the other ranks per step.
        node_bytes: bytes the busiest node sends to, or receives from, other nodes per step
            (ranks ``n * per_node ... (n + 1) * per_node - 1`` on node ``n``), the larger of
            the two: a link carries both directions at once.
        exchanges: all-to-alls per step (halo exchanges and the all-reduce's two).
        blocked_s: time blocked in exchanges and reductions per step on one node (max over
            ranks) with the overlap on, as training runs.
        blocked_off_s: the same with the overlap off: what the exchanges cost on one node.
    """

    compute_s: float
    codec_s: float
    max_rank_bytes: float
    node_bytes: float
    exchanges: int
    blocked_s: float = 0.0
    blocked_off_s: float = 0.0

    @classmethod
    def from_worker(
        cls, fp32: dict, codec: dict, per_node: int, codec_off: dict | None = None
    ) -> LinkRun:
        """From the worker's medians of the fp32 step and of the codec's (overlap on, and
        ``codec_off`` with the overlap off)."""
        matrix = codec["peer_bytes"]
        size = len(matrix)
        rank_bytes = [sum(b for q, b in enumerate(row) if q != r) for r, row in enumerate(matrix)]
        nodes = range(size // per_node)

        def node_of(r: int) -> int:
            return r // per_node

        out = [
            sum(
                matrix[r][q]
                for r in range(size)
                for q in range(size)
                if node_of(r) == n != node_of(q)
            )
            for n in nodes
        ]
        into = [
            sum(
                matrix[r][q]
                for r in range(size)
                for q in range(size)
                if node_of(q) == n != node_of(r)
            )
            for n in nodes
        ]
        return cls(
            compute_s=fp32["step_s"] - fp32["halo_wait_s"] - fp32["reduce_s"],
            codec_s=codec["codec_s"],
            max_rank_bytes=float(max(rank_bytes)),
            node_bytes=float(max(max(out), max(into))) if size // per_node > 1 else 0.0,
            exchanges=int(codec.get("exchanges", 0)),
            blocked_s=codec["halo_wait_s"] + codec["reduce_s"],
            blocked_off_s=(codec_off or codec)["halo_wait_s"] + (codec_off or codec)["reduce_s"],
        )


def projected_epoch_s(
    run: LinkRun, bits_per_s: float, model: str = "v1", rtt_s: float = 0.0
) -> float:
    """The projected training-step time on links of ``bits_per_s``.

    Args:
        run: the one-node measurements.
        bits_per_s: the link rate (``v0``: nominal; ``v1``: as measured by a TCP stream).
        model: ``v0`` (the old model) or ``v1``.
        rtt_s: round trip between two nodes (``v1``: one per exchange).

    Returns:
        Seconds per training step.
    """
    if model == "v0":
        return run.compute_s + run.codec_s + run.max_rank_bytes * 8 / bits_per_s
    if model != "v1":
        raise ValueError(f"unknown link model {model!r}")
    return run.compute_s + run.codec_s + run.blocked_s + link_transfer_s(run, bits_per_s, rtt_s)


def link_transfer_s(run: LinkRun, bits_per_s: float, rtt_s: float = 0.0) -> float:
    """``v1``'s time on the link per step: the busiest node's bytes, one round trip per
    all-to-all."""
    return run.node_bytes * 8 / bits_per_s + run.exchanges * rtt_s


def projected_exchange_s(
    run: LinkRun, bits_per_s: float, model: str = "v1", rtt_s: float = 0.0
) -> float:
    """The projected time blocked in exchanges per step with the overlap off.

    ``v0``: the busiest rank's bytes at the nominal rate; ``v1``: the one-node blocked time
    plus :func:`link_transfer_s`.
    """
    if model == "v0":
        return run.max_rank_bytes * 8 / bits_per_s
    return run.blocked_off_s + link_transfer_s(run, bits_per_s, rtt_s)


def fit_report(table: Iterable[dict], limit: float = 0.2) -> list[str]:
    """Lines saying where each model is off by more than ``limit`` (measured / model - 1)."""
    rows = list(table)
    lines = []
    for key, name in (
        ("err0", "epoch, old model (v0)"),
        ("err", "epoch, model v1"),
        ("xerr0", "exchange, old model (v0)"),
        ("xerr", "exchange, model v1"),
    ):
        off = [r for r in rows if abs(r[key]) > limit]
        errs = [abs(r[key]) for r in rows]
        lines.append(
            f"{name}: median |error| {100 * statistics.median(errs):.0f}%, "
            f"{len(off)} of {len(rows)} cells off by more than {100 * limit:.0f}%"
            + (
                ": "
                + ", ".join(
                    f"{r['layout']}/{r['rate']}/{r['codec']} {100 * r[key]:+.0f}%" for r in off
                )
                if off
                else ""
            )
        )
    return lines
