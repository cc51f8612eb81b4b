"""A rank's aggregation operator split by column block: :class:`SplitOperator` (``A_inner``
over the inner rows' own columns, ``A_halo`` over the halo rows'), with the transposes of the
backward pass and the pieces a sliced exchange adds one by one (slice ``k``'s halo columns, the
inner rows they reach)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fullgraph.distributed.exchange_slices import ExchangeSlice
from fullgraph.kernels import CSRMatrix, spmm_add_


@dataclass
class SplitOperator:
    """A local aggregation operator split by column block, with transposes for backward.

    Attributes:
        inner: rows = inner nodes, columns = inner nodes.
        halo: rows = inner nodes, columns = halo nodes (``None`` without halo).
    """

    inner: CSRMatrix
    halo: CSRMatrix | None

    def __post_init__(self) -> None:
        self.inner_t = self.inner.t()
        self.halo_t = self.halo.t() if self.halo is not None else None
        self._pieces: dict[tuple[int, int], tuple[torch.Tensor, CSRMatrix, CSRMatrix]] = {}
        self._slots: tuple[torch.Tensor, torch.Tensor, CSRMatrix | None] | None = None

    def halo_slots(self) -> tuple[torch.Tensor, torch.Tensor, CSRMatrix | None]:
        """``(rows, slot, compact)``: the inner rows with halo entries (ascending), each inner
        row's index among them (``-1`` for the others), and the halo block of those rows only
        (``None`` without halo); built on first use, kept. An exact bf16 aggregation keeps
        those rows' sums in float64 until their halo terms are in."""
        if self._slots is None:
            n = self.inner.num_rows
            slot = torch.full((n,), -1, dtype=torch.int64, device=self.inner.device)
            if self.halo is None:
                rows = torch.zeros(0, dtype=torch.int64, device=self.inner.device)
                compact = None
            else:
                rows, compact = self.halo.without_empty_rows()
                slot[rows] = torch.arange(rows.numel(), device=slot.device)
            self._slots = (rows, slot, compact)
        return self._slots

    def _piece(self, piece: ExchangeSlice) -> tuple[torch.Tensor, CSRMatrix, CSRMatrix]:
        """Slice ``piece``'s halo columns: the inner rows they reach, those rows' block, and
        the block's transpose (built on first use, kept; nothing of ``num_inner`` rows)."""
        key = (piece.count, piece.index)
        if key not in self._pieces:
            assert self.halo is not None
            block = self.halo.select_columns(piece.halo_rows.to(self.halo.device))
            rows, compact = block.without_empty_rows()
            self._pieces[key] = (rows, compact, block.transposed())
        return self._pieces[key]

    def halo_transpose(self, piece: ExchangeSlice | None) -> CSRMatrix | None:
        """``A_halo^T`` restricted to the halo rows slice ``piece`` brings (all for ``None``):
        rows = those halo rows, columns = inner rows."""
        if self.halo is None:
            return None
        if piece is None:
            return self.halo_t
        return self._piece(piece)[2]

    def add_halo_product(
        self, y: torch.Tensor, halo: torch.Tensor, piece: ExchangeSlice | None = None
    ) -> torch.Tensor:
        """``y += A_halo @ halo`` in place (:func:`~fullgraph.kernels.spmm_add_`: no
        temporary on the CPU, row blocks of at most 8 MB elsewhere).

        Args:
            y: the inner product, float [num_inner, W] (modified).
            halo: the halo rows (of slice ``piece``), float [rows, W].
            piece: the slice ``halo`` holds, or ``None`` for all halo rows.

        Returns:
            ``y``.
        """
        if self.halo is None or halo.shape[0] == 0:
            return y
        if piece is None:
            return spmm_add_(y, self.halo, halo)
        rows, compact, _ = self._piece(piece)
        return spmm_add_(y, compact, halo, rows.to(y.device))

    def add_halo_partial(
        self, partial: torch.Tensor, halo: torch.Tensor, piece: ExchangeSlice | None = None
    ) -> torch.Tensor:
        """``partial += A_halo @ halo`` over the rows of :meth:`halo_slots` only (``partial``
        float64 [len(rows), W], ``halo`` bfloat16): the halo terms of an exact aggregation."""
        if self.halo is None or halo.shape[0] == 0:
            return partial
        _, slot, compact = self.halo_slots()
        if piece is None:
            assert compact is not None
            return spmm_add_(partial, compact, halo)
        rows, block, _ = self._piece(piece)
        return spmm_add_(partial, block, halo, slot[rows.to(slot.device)])
