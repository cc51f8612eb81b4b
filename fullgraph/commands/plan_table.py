"""The pieces both plans print with (``fullgraph plan`` and ``fullgraph plan minibatch``): the
node options, the per-rank table of terms and every node's verdict."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from fullgraph.config import Config, number, option
from fullgraph.errors import ConfigError
from fullgraph.memory.model import TERMS, Prediction
from fullgraph.memory.plan import GIB, mib, node_fits, node_line, ranks_label

#: Column headings of the terms in the table (same order as :data:`TERMS`).
SHORT = {
    "structure": "structure",
    "features": "features",
    "saved": "saved",
    "working": "temporaries",
    "halo": "halo bufs",
    "optimizer": "grad+optim",
    "compression": "residuals",
    "floor": "floor",
}


@dataclass
class PlanOptions(Config):
    """What ``fullgraph plan`` looks at besides the model and its data: the nodes."""

    ranks_per_node: int | None = option(
        None,
        "ranks on each node, consecutive ranks together (default: all on one node)",
        check=number(low=1, integer=True, optional=True),
        metavar="K",
    )
    node_memory: float | None = option(
        None,
        "memory of one node in GiB (default: this machine's total memory, or this process's "
        "cgroup limit when lower)",
        check=number(low=0.0, low_open=True, optional=True),
        metavar="GIB",
    )
    predict: bool = option(
        False,
        "the peak of `fullgraph predict` with this model on these parts (the evaluation "
        "forward, every embedding and the outputs written; no gradients or optimiser state), "
        "the training peak beside it",
    )
    floor_mb: float | None = option(
        None,
        "process floor of a rank in MiB (default: measured now, by training the same model "
        "for two epochs on a 64-node graph in this process)",
        check=number(low=0.0, optional=True),
        metavar="MB",
    )


def size_table(
    size_head: list[str],
    sizes: list[list[str]],
    preds: list[Prediction],
    headings: dict[str, str] | None = None,
) -> list[str]:
    """:func:`format_table` with the size columns given: ``size_head`` and a row per rank."""
    short = headings or SHORT
    head = ["rank", *size_head] + [short[t] for t in TERMS] + ["total", "peak in"]
    rows = [head]
    for size, p in zip(sizes, preds, strict=True):
        rows.append(
            [str(p.rank), *size] + [mib(p.terms[t]) for t in TERMS] + [mib(p.total), p.phase]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    return [
        "  ".join(c.rjust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]


def print_fits(
    preds: list[Prediction], per_node: int, node_memory: int, advice: str, shared: int = 0
) -> None:
    """Every node's verdict; one that does not fit ends the command.

    Args:
        preds: every rank's prediction.
        per_node: ranks on each node, consecutive ranks together.
        node_memory: the memory of one node, bytes.
        advice: the last of the remedies named (after more ranks, fewer per node).
        shared: the floor's file-backed bytes, counted once per node (:func:`node_fits`).

    Raises:
        ConfigError: a node does not fit (one line naming the worst).
    """
    fits = node_fits(preds, per_node, node_memory, shared)
    for nf in fits:
        print(node_line(nf))
    sys.stdout.flush()
    bad = [nf for nf in fits if not nf.fits]
    if bad:
        worst = max(bad, key=lambda nf: nf.need - nf.have)
        raise ConfigError(
            f"does not fit: node {worst.node} ({ranks_label(worst.ranks)}) needs "
            f"{worst.need / GIB:.2f} GiB of {worst.have / GIB:.2f} GiB; use more ranks, "
            f"fewer per node (--ranks-per-node), {advice}"
        )
