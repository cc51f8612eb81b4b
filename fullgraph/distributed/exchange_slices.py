"""Slices of a halo exchange: each slice carries a share of every peer's rows.

A wide exchange (a hidden layer's halo rows at scale) needs send and receive buffers as large as
the activations themselves. Sent in ``K`` slices, at most two in flight, a rank holds two
slices' buffers instead. Slice ``k`` carries rows ``[n*k//K, n*(k+1)//K)`` of the ``n`` rows a
rank exchanges with each peer; both sides of a pair compute the same share from the same count,
so every slice is itself a valid all-to-all. Rows keep their full width, so nothing is copied
out of strided columns. The aggregations sum a row in one pass over all its sources, so their
slices :func:`land` in one receive buffer (the send side stays two slices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

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


def cached_slices(
    cache: dict[int, list[ExchangeSlice]],
    send_index: torch.Tensor,
    send_counts: list[int],
    recv_counts: list[int],
    max_rows: int,
    width: int,
    budget: int,
) -> list[ExchangeSlice | None]:
    """The slices a ``width``-column exchange of these maps goes in under ``budget`` bytes
    (``[None]``: whole), built once per slice count and kept in ``cache``."""
    count = slice_count(max_rows, width, budget)
    if count == 1:
        return [None]
    if count not in cache:
        cache[count] = exchange_slices(send_index, send_counts, recv_counts, count)
    return list(cache[count])


class Pending(Protocol):
    """An exchange in flight: :meth:`wait` gives its received rows."""

    def wait(self) -> torch.Tensor:
        """Block until the rows have landed; return them."""
        ...


def land(
    start: Callable[[ExchangeSlice | None], Pending],
    pieces: Sequence[ExchangeSlice | None],
    rows: int,
    overlapped: Callable[[], None],
) -> torch.Tensor:
    """The received rows of an exchange going in ``pieces`` (``[None]``: whole), in one buffer.

    ``start(piece)`` starts one slice; ``overlapped()`` runs while the first is in flight; then
    every slice lands, the next one in flight meanwhile, and is copied into a buffer of ``rows``
    rows at its ``halo_rows`` (its own buffers released once copied). A whole exchange returns
    its received rows themselves.
    """
    pending: Pending | None = start(pieces[0])
    overlapped()
    landed: torch.Tensor | None = None
    for k, piece in enumerate(pieces):
        following = start(pieces[k + 1]) if k + 1 < len(pieces) else None
        assert pending is not None
        got = pending.wait()
        pending = following
        if piece is None:
            return got
        if landed is None:
            landed = got.new_empty((rows, got.shape[1]))
        landed[piece.halo_rows.to(got.device)] = got
        del got
    assert landed is not None
    return landed
