"""Worker of the block-tree tests (``tests/distributed/test_tree_sum.py``), run by
:func:`harness.run_task`.

``tree --num-blocks B --width W --modes M... --transports T...``: every rank makes the same
per-block partials (:func:`block_partials`), keeps the blocks that :func:`assign` gives it
under each mode, pushes them on its stack and calls ``Communicator.tree_sum_``; saves (rank 0,
``.json``) the failures of every rank (a root that is not the one-process root bit for bit, or
differs between ranks) and the bytes each rank sent per call against ``allreduce_``'s.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from harness import Tasks, communicators, main

from fullgraph.distributed.communicator import chunk_sizes
from fullgraph.distributed.tree_sum import DyadicStack

MODES = ("runs", "uneven", "scattered")


def block_partials(num_blocks: int, width: int, seed: int = 7) -> torch.Tensor:
    """float32 [num_blocks, width] of wide dynamic range: the order of a sum changes its bits."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.pow(10.0, torch.randint(-4, 5, (num_blocks, width), generator=g).float())
    return torch.randn(num_blocks, width, generator=g) * scale


def assign(num_blocks: int, ranks: int, mode: str) -> list[np.ndarray]:
    """Each rank's blocks (ascending) under ``mode``: ``runs`` (even contiguous runs),
    ``uneven`` (contiguous runs of growing length), ``scattered`` (non-contiguous unions)."""
    ids = np.arange(num_blocks)
    if mode == "runs":
        owner = np.repeat(np.arange(ranks), chunk_sizes(num_blocks, ranks))
    elif mode == "uneven":
        cuts = [round(num_blocks * ((r + 1) / ranks) ** 2) for r in range(ranks)]
        owner = np.searchsorted(np.asarray(cuts), ids, side="right")
    elif mode == "scattered":
        owner = (ids * 5 + ids // 3) % ranks
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return [ids[owner == r] for r in range(ranks)]


def local_stack(partials: torch.Tensor, blocks: np.ndarray) -> DyadicStack:
    """A rank's stack after pushing its blocks' partials in ascending order."""
    stack = DyadicStack(int(partials.shape[0]))
    for b in blocks:
        stack.push((0, int(b)), partials[int(b)].clone())
    return stack


TASKS = Tasks()


@TASKS.task
def tree(*, num_blocks: int, width: int, modes: list[str], transports: list[str]) -> dict:
    """``tree_sum_`` under every mode over each transport against the one-process root."""
    partials = block_partials(num_blocks, width)
    want = local_stack(partials, np.arange(num_blocks)).root()
    failures: list[str] = []
    bytes_sent: dict[str, list[int]] = {}
    for transport, comm in communicators(transports):
        mine: list[str] = []
        for mode in modes:
            blocks = assign(num_blocks, comm.size, mode)[comm.rank]
            stack = local_stack(partials, blocks)
            nodes = torch.stack(stack.values) if stack.values else torch.empty(0, width)
            before = comm.bytes_sent["reduce"]
            got = comm.tree_sum_(nodes, stack.labels, num_blocks, key=mode)
            again = comm.tree_sum_(nodes, stack.labels, num_blocks, key=mode)  # cached labels
            tree_bytes = comm.bytes_sent["reduce"] - before
            if not torch.equal(got, want):
                diff = float((got - want).abs().max())
                mine.append(f"{mode}: the root differs from one process's by up to {diff:g}")
            if not torch.equal(again, got):
                mine.append(f"{mode}: a second call gave other bits")
            before = comm.bytes_sent["reduce"]
            comm.allreduce_(partials[0].clone(), "sum", tag="reduce")
            flat_bytes = comm.bytes_sent["reduce"] - before
            every = comm.allgather_object((got.numpy().tobytes(), tree_bytes // 2, flat_bytes))
            if any(g[0] != every[0][0] for g in every):
                mine.append(f"{mode}: the ranks' roots differ")
            bytes_sent[f"{transport}/{mode}"] = [[g[1], g[2]] for g in every]
        for rank, theirs in enumerate(comm.allgather_object(mine)):
            failures += [f"{transport} rank {rank}: {f}" for f in theirs]
    return {"failures": failures, "bytes": bytes_sent}


if __name__ == "__main__":
    sys.exit(main(TASKS))
