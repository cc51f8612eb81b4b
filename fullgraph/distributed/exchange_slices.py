"""Slices of a halo exchange: each slice carries a share of every peer's rows.

A wide exchange (a hidden layer's halo rows at scale) needs send and receive buffers as large as
the activations themselves. Sent in ``K`` slices, at most two in flight, a rank holds two
slices' buffers instead. Slice ``k`` carries rows ``[n*k//K, n*(k+1)//K)`` of the ``n`` rows a
rank exchanges with each peer; both sides of a pair compute the same share from the same count,
so every slice is itself a valid all-to-all. Rows keep their full width, so nothing is copied
out of strided columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Default of the largest send or receive buffer (bytes, over all ranks) an uncompressed
#: exchange may use at once; a larger exchange goes in slices (:func:`slice_count`). A slice
#: costs one more all-to-all (its halo product is added in place, over the rows it reaches), and
#: two slices are in flight at once, so the buffers of an exchange stay under four times this.
DEFAULT_BUFFER_BYTES = 32 << 20


@dataclass
class ExchangeSlice:
    """Slice ``index`` of ``count`` of an exchange.

    Attributes:
        index: which slice.
        count: how many slices the exchange has.
        send_index: local inner ids this rank sends in the slice, grouped by peer, int64.
        send_counts: rows sent to each peer in the slice.
        recv_counts: rows received from each peer in the slice.
        halo_rows: positions among this rank's halo rows of the rows received, grouped by
            peer, ascending, int64.
    """

    index: int
    count: int
    send_index: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    halo_rows: torch.Tensor


def slice_count(max_rows: int, width: int, budget: int) -> int:
    """Slices needed so that no rank's buffer of ``max_rows`` rows x ``width`` float32
    columns exceeds ``budget`` bytes (1: the exchange goes whole)."""
    if max_rows <= 0:
        return 1
    return max(1, min(max_rows, -(-4 * max_rows * width // max(budget, 1))))


def _shares(counts: list[int], k: int, slices: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of slice ``k`` within every peer's block of rows."""
    out, offset = [], 0
    for n in counts:
        out.append((offset + n * k // slices, offset + n * (k + 1) // slices))
        offset += n
    return out


def exchange_slices(
    send_index: torch.Tensor, send_counts: list[int], recv_counts: list[int], slices: int
) -> list[ExchangeSlice]:
    """The ``slices`` slices of the exchange described by ``send_index`` and the counts."""
    out = []
    for k in range(slices):
        sent = _shares(send_counts, k, slices)
        received = _shares(recv_counts, k, slices)
        out.append(
            ExchangeSlice(
                index=k,
                count=slices,
                send_index=torch.cat([send_index[a:b] for a, b in sent]),
                send_counts=[b - a for a, b in sent],
                recv_counts=[b - a for a, b in received],
                halo_rows=torch.cat([torch.arange(a, b, dtype=torch.int64) for a, b in received]),
            )
        )
    return out
