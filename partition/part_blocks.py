"""The block arrays of one part: which blocks it holds, where each starts, and for a
receptive-field cut where its rows sit in the whole graph's blocks."""

from __future__ import annotations

import numpy as np

from fullgraph.partition.blocks import NodeBlocks


def part_block_arrays(blocks: NodeBlocks, inner: np.ndarray) -> dict[str, np.ndarray]:
    """``block_ids`` and ``block_ptr`` of a part whose inner rows ``inner`` are in (block, id)
    order; for a receptive-field cut also ``block_pos`` (each row's position in its block of
    the whole graph) and ``block_full`` (each of the part's blocks' size there)."""
    inner_blocks = blocks.block[inner]
    starts = np.flatnonzero(np.diff(inner_blocks)) + 1
    ni = int(inner_blocks.size)
    first = np.concatenate([[0], starts]).astype(np.int64) if ni else np.zeros(0, np.int64)
    arrays = {
        "block_ids": np.asarray(inner_blocks[first], dtype=np.int64),
        "block_ptr": np.concatenate([first, [ni]]).astype(np.int64),
    }
    if blocks.position is not None and blocks.full_rows is not None:
        arrays["block_pos"] = np.asarray(blocks.position[inner], dtype=np.int64)
        arrays["block_full"] = np.asarray(blocks.full_rows[arrays["block_ids"]], dtype=np.int64)
    return arrays
