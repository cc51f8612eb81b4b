"""A rank's aggregation operator split by column block: :class:`SplitOperator` (``A_inner``
over the inner rows' own columns, ``A_halo`` over the halo rows'), with the transposes of the
backward pass, the pieces a sliced exchange adds one by one (slice ``k``'s halo columns, the
inner rows they reach), and the rank-count-invariant forms the aggregations run on
(:mod:`fullgraph.distributed.ordered`: every row summed in ascending global id of its
sources), built on first use and kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fullgraph.distributed.exchange_slices import ExchangeSlice
from fullgraph.distributed.ordered import ReversePlan, RowSplit, forward_split, reverse_plan
from fullgraph.kernels import CSRMatrix, spmm_add_

if TYPE_CHECKING:
    from fullgraph.distributed.communicator import Communicator


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
        self._pieces: dict[tuple[int, int], tuple[torch.Tensor, CSRMatrix, CSRMatrix]] = {}
        # keyed by the maps they were built from (kept alive with them: ids stay distinct)
        self._ordered: tuple[object, RowSplit] | None = None
        self._reverse: dict[int, tuple[torch.Tensor, object, ReversePlan]] = {}

    @property
    def inner_t(self) -> CSRMatrix:
        """``A_inner^T`` (built on first use, kept on ``inner``): the previous backward's;
        the ordered aggregations use :meth:`reverse` instead."""
        return self.inner.t()

    @property
    def halo_t(self) -> CSRMatrix | None:
        """``A_halo^T`` (built on first use, kept on ``halo``), or ``None`` without halo."""
        return self.halo.t() if self.halo is not None else None

    def ordered(self, global_ids: torch.Tensor | None) -> RowSplit:
        """The forward :class:`~fullgraph.distributed.ordered.RowSplit`: every row's entries
        in ascending global id of the source (``global_ids``: of every local node, inner then
        halo; ``None``: the local ids), built on first use for these ids, kept."""
        if self._ordered is None or self._ordered[0] is not global_ids:
            self._ordered = (global_ids, forward_split(self.inner, self.halo, global_ids))
        return self._ordered[1]

    def reverse(
        self,
        comm: Communicator,
        send_index: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        global_ids: torch.Tensor | None,
    ) -> ReversePlan:
        """The backward exchange and transpose (:func:`~fullgraph.distributed.ordered.
        reverse_plan`) of this operator under a halo plan's maps; built on first use (a
        collective: every rank's first backward pass through the operator builds it), kept."""
        held = self._reverse.get(id(send_index))
        if held is None or held[0] is not send_index or held[1] is not global_ids:
            plan = reverse_plan(
                self.inner, self.halo, comm, send_index, send_counts, recv_counts, global_ids
            )
            held = self._reverse[id(send_index)] = (send_index, global_ids, plan)
        return held[2]

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
