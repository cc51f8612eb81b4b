"""Bytes of an aggregation's backward exchange: halo partial sums (before issue 33) against the
``dY`` rows of boundary rows the ordered backward sends (:mod:`fullgraph.distributed.ordered`).

For each P it partitions the dataset (METIS, into a temporary directory), builds every part's
operator of the layer kind and counts, per rank, the rows each scheme sends to its peers in one
backward exchange: before, one partial sum per halo row (``num_halo``); now, one ``dY`` row per
(peer, boundary row reading a column that peer owns). Bytes are for float32 rows of ``--width``
columns. Also says whether the new rows are exactly the forward exchange's (a symmetric graph).

Usage::

    python -m bench.ordered_bytes --dataset coauthor-physics --root ../shared/datasets --parts 2 4
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from fullgraph.datasets import registry
from fullgraph.partition import load_partition, partition_graph
from fullgraph.training.assembly import build_operator


def backward_rows(part, kind: str) -> tuple[int, int, int]:
    """``(partial sums sent before, dY rows sent now, rows the forward sends)`` of one part."""
    op = build_operator(part, kind)
    forward = int(part.send_offsets[-1])
    if op.halo is None:
        return 0, 0, forward
    recv_counts = np.diff(np.asarray(part.recv_offsets))
    owner = np.repeat(np.arange(recv_counts.size), recv_counts)
    rows = op.halo.row_of_entry().numpy()
    peers = owner[op.halo.indices.numpy().astype(np.int64)]
    pairs = np.unique(peers * max(part.num_inner, 1) + rows)
    return int(part.num_halo), int(pairs.size), forward


def main(argv: list[str] | None = None) -> int:
    """Print one line per P: rows and MiB per backward exchange, before and now."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="coauthor-physics")
    parser.add_argument("--root", type=Path, default=Path("../shared/datasets"))
    parser.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--kind", default="gcn")
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args(argv)
    graph = registry.load(args.dataset, args.root)
    mib = 4 * args.width / 2**20
    for p in args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            partition_graph(graph, p, Path(tmp) / "parts", method="metis", seed=0)
            counts = [
                backward_rows(load_partition(Path(tmp) / "parts", r, mmap=False), args.kind)
                for r in range(p)
            ]
        before, now, forward = (sum(c[i] for c in counts) for i in range(3))
        print(
            f"{args.dataset} P={p} {args.kind} W={args.width}: before {before:,} rows "
            f"({before * mib:.1f} MiB), now {now:,} rows ({now * mib:.1f} MiB), forward "
            f"{forward:,} rows; per rank now {[c[1] for c in counts]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
