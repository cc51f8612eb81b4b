"""GAT's attention-dropout mask: a counter hash of an edge's global endpoint ids.

The mask of edge ``src -> dst``, head ``h`` hashes the global ids under a key of ``(seed, epoch,
layer, word)`` (:func:`attention_keys`), so one process and P ranks drop the same edges whatever
the numbering of the local nodes. :func:`attention_keep` is its torch form; the numba kernels of
:mod:`fullgraph.kernels.edge_attention_cpu` draw the same bits from the same keys.
"""

from __future__ import annotations

import numpy as np
import torch

from fullgraph.hashing import as_int64, key_chain, splitmix64_torch

#: The coordinate that separates attention-dropout streams from the node-dropout streams of the
#: same (seed, epoch, layer) (``key_chain(seed, epoch, layer)``).
ATTENTION_TAG = 0x47415421  # "GAT!"


def attention_keys(seed: int, epoch: int, layer: int, heads: int) -> np.ndarray:
    """The 64-bit keys of one layer's attention-dropout streams, one per group of 4 heads.

    Word ``w`` (heads ``4w .. 4w+3``) has key ``key_chain(seed, epoch, layer, ATTENTION_TAG,
    w)``.

    Args:
        seed: the run's seed.
        epoch: the epoch.
        layer: the layer's index in the stack.
        heads: number of heads.

    Returns:
        uint64 [ceil(heads / 4)].
    """
    words = (heads + 3) // 4
    return np.array(
        [key_chain(seed, epoch, layer, ATTENTION_TAG, w) for w in range(words)], dtype=np.uint64
    )


def attention_keep(
    dst_gids: torch.Tensor, src_gids: torch.Tensor, keys: np.ndarray, heads: int, p: float
) -> torch.Tensor:
    """The attention-dropout keep-mask of edges ``src -> dst`` (global node ids).

    Edge ``(dst, src)``, head ``h``: lane ``h % 4`` (16 bits) of
    ``splitmix64(splitmix64(keys[h // 4] ^ dst) ^ src)``, kept when the lane is
    ``>= round(p * 65536)``. A pure function of (seed, epoch, layer, head, edge): the same on
    every rank and for any numbering of the local nodes. Self-loops are edges ``(i, i)``.

    Args:
        dst_gids: global id of every edge's destination, int64 [E].
        src_gids: global id of every edge's source, int64 [E].
        keys: :func:`attention_keys` of the layer.
        heads: number of heads.
        p: drop probability in ``[0, 1)``.

    Returns:
        bool [E, heads] on the device of ``dst_gids``.
    """
    dst = dst_gids.to(torch.int64)
    src = src_gids.to(torch.int64)
    threshold = round(p * 65536)
    cols = []
    for w in range(len(keys)):
        z = splitmix64_torch(splitmix64_torch(dst ^ as_int64(int(keys[w]))) ^ src)
        for lane in range(min(4, heads - 4 * w)):
            cols.append(((z >> (16 * lane)) & 0xFFFF) >= threshold)
    return torch.stack(cols, dim=1)
