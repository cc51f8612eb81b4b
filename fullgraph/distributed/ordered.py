"""Aggregations whose bits do not depend on the number of ranks (issue 33).

Every sum over a row's in-neighbours adds its terms in ascending GLOBAL id of the source, in one
pass of one kernel (:func:`~fullgraph.kernels.spmm_ordered_`), whether the sources are local
rows or halo rows, for every P and for one process (whose bits are the definition):

- forward, ``Y = A H``: :class:`RowSplit` of the rank's operator, its rows split into the
  *interior* ones (no halo column: computed while the exchange is in flight) and the
  *boundary* ones (computed in one pass over ``[H; halo]`` once the halo rows have landed);
- backward, ``dH = A^T dY``: :class:`ReversePlan`, built once per operator and plan (a
  collective): every rank sends, per peer, the ``dY`` rows of its rows ``i`` that read a column
  ``j`` the peer owns, and the owner sums ``dH_j = sum_i a_ij dY_i`` over ALL in-edges of
  ``j`` in ascending global id of ``i`` (local ``dY`` rows and received ones alike).

Ties (duplicate edges with one source) are broken by the entry's value, so the order is a
function of the entries alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fullgraph.distributed import exchange_slices as slicing
from fullgraph.distributed.communicator import Communicator
from fullgraph.kernels import CSRMatrix


@dataclass
class RowSplit:
    """An operator's rows in the order of their sums, split by where their sources are.

    Attributes:
        num_rows: rows of the operator.
        interior_rows: int64, the rows whose every source is local (those without entries
            too), ascending.
        interior: CSR of those rows (row ``k`` is row ``interior_rows[k]``), ``num_local``
            columns.
        boundary_rows: int64, the rows reading some remote source, ascending.
        boundary: CSR of those rows; a column ``>= num_local`` is remote row
            ``column - num_local``.
        num_local: columns that are local rows.
    """

    num_rows: int
    interior_rows: torch.Tensor
    interior: CSRMatrix
    boundary_rows: torch.Tensor
    boundary: CSRMatrix
    num_local: int

    def to(self, device: torch.device) -> RowSplit:
        """This split on ``device`` (``self`` when already there)."""
        if self.interior.device == device:
            return self
        return RowSplit(
            self.num_rows,
            self.interior_rows.to(device),
            self.interior.to(device),
            self.boundary_rows.to(device),
            self.boundary.to(device),
            self.num_local,
        )


#: Entries :func:`ordered_split` sorts at a time: its temporaries grow with this, not with the
#: operator (products-synth, 31M entries a rank at P = 4: the whole-array sort took ~2.5 GB).
SORT_CHUNK = 1 << 20


def _row_chunks(indptr: np.ndarray, chunk: int) -> np.ndarray:
    """Row boundaries ``[0, ..., num_rows]`` of consecutive row ranges of about ``chunk``
    entries each (a row longer than ``chunk`` is a range of its own)."""
    nnz = int(indptr[-1])
    targets = np.arange(chunk, nnz, chunk, dtype=np.int64)
    cuts = np.searchsorted(indptr, targets, side="right") - 1
    bounds = np.concatenate([[0], cuts, [indptr.size - 1]]).astype(np.int64)
    return np.unique(bounds)


def ordered_split(
    rows: np.ndarray,
    cols: np.ndarray,
    vals: np.ndarray | None,
    keys: np.ndarray,
    num_rows: int,
    num_local: int,
    num_cols: int,
) -> RowSplit:
    """The :class:`RowSplit` of the entries ``(rows, cols, vals)``: every row's entries in
    ascending ``keys`` (the global id of the source), ties by value, then by input order.

    The entries are grouped by row (a stable sort of the row ids), then sorted a chunk of
    whole rows at a time (:data:`SORT_CHUNK` entries) straight into the two splits' arrays:
    beside the inputs it holds one int64 per entry and the outputs.

    Args:
        rows, cols: int [m], the entries' row and column.
        vals: float32 [m] or ``None`` (all ones).
        keys: int64 [m], the order of a row's terms.
        num_rows: rows of the operator.
        num_local: columns below this are local rows; the others are remote.
        num_cols: columns of the operator.
    """
    rows, cols, keys = (np.asarray(a, dtype=np.int64) for a in (rows, cols, keys))
    vals = None if vals is None else np.asarray(vals, dtype=np.float32)
    counts = np.bincount(rows, minlength=num_rows).astype(np.int64)
    by_row = np.argsort(rows, kind="stable")
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    remote = np.zeros(num_rows, dtype=bool)
    remote[rows[cols >= num_local]] = True
    keeps = (np.flatnonzero(~remote), np.flatnonzero(remote))
    widths = (num_local, num_cols)
    out_cols, out_vals, offsets = [], [], [0, 0]
    for keep, width in zip(keeps, widths, strict=True):
        size = int(counts[keep].sum())
        out_cols.append(np.empty(size, dtype=np.int32 if width < 2**31 else np.int64))
        out_vals.append(None if vals is None else np.empty(size, dtype=np.float32))
    bounds = _row_chunks(indptr, SORT_CHUNK)
    for r0, r1 in zip(bounds[:-1], bounds[1:], strict=True):
        idx = by_row[indptr[r0] : indptr[r1]]
        row = rows[idx]
        sort_keys = [keys[idx], row] if vals is None else [vals[idx], keys[idx], row]
        idx = idx[np.lexsort(sort_keys)]
        side = remote[rows[idx]]
        for k, mask in enumerate((~side, side)):
            picked = idx[mask]
            o = offsets[k]
            out_cols[k][o : o + picked.size] = cols[picked]
            if vals is not None:
                out_vals[k][o : o + picked.size] = vals[picked]
            offsets[k] = o + picked.size
    split = []
    for keep, width, c, v in zip(keeps, widths, out_cols, out_vals, strict=True):
        ptr = np.zeros(keep.size + 1, dtype=np.int64)
        np.cumsum(counts[keep], out=ptr[1:])
        split.append(
            (torch.from_numpy(keep.astype(np.int64)), CSRMatrix(ptr, c, v, num_cols=width))
        )
    (interior_rows, interior), (boundary_rows, boundary) = split
    return RowSplit(num_rows, interior_rows, interior, boundary_rows, boundary, num_local)


def _entries(a: CSRMatrix | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(rows, cols, vals)`` of ``a``'s entries on the CPU (empty for ``None``)."""
    if a is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), None
    rows = a.row_of_entry().cpu().numpy()
    cols = a.indices.cpu().numpy().astype(np.int64)
    vals = None if a.values is None else a.values.cpu().numpy()
    return rows, cols, vals


def _values(parts: list[np.ndarray | None], sizes: list[int]) -> np.ndarray | None:
    """The values of concatenated entry lists (``None`` when every list is unweighted)."""
    if all(p is None for p in parts):
        return None
    return np.concatenate(
        [np.ones(n, np.float32) if p is None else p for p, n in zip(parts, sizes, strict=True)]
    )


def local_global_ids(global_ids: torch.Tensor | None, num_local: int) -> np.ndarray:
    """Global id of every local row (the local id itself without a map: one process)."""
    if global_ids is None:
        return np.arange(num_local, dtype=np.int64)
    return global_ids.cpu().numpy().astype(np.int64, copy=False)


def forward_split(
    inner: CSRMatrix, halo: CSRMatrix | None, global_ids: torch.Tensor | None
) -> RowSplit:
    """The forward :class:`RowSplit` of a split operator: columns ``0..n-1`` the inner rows,
    ``n + k`` halo row ``k``, every row's entries in ascending global id of the source.

    Args:
        inner: rows = inner nodes, columns = inner nodes.
        halo: rows = inner nodes, columns = halo nodes, or ``None``.
        global_ids: global id of every local node (inner, then halo), or ``None``: the local
            ids are the global ones (one process).
    """
    n = inner.num_rows
    num_halo = 0 if halo is None else halo.num_cols
    gids = local_global_ids(global_ids, n + num_halo)
    ri, ci, vi = _entries(inner)
    rh, ch, vh = _entries(halo)
    ch = ch + n
    rows, cols = np.concatenate([ri, rh]), np.concatenate([ci, ch])
    vals = _values([vi, vh], [ri.size, rh.size])
    del ri, ci, vi, rh, ch, vh  # the concatenated copies are what the sort reads
    split = ordered_split(rows, cols, vals, gids[cols], n, n, n + num_halo)
    return split.to(inner.device)


@dataclass
class ReversePlan:
    """The backward exchange of an ordered aggregation: ``dY`` rows of boundary rows go to
    the owners of the columns they read, who sum ``A^T dY`` in ascending global id.

    Attributes:
        send_index: local inner rows whose ``dY`` is sent, grouped by peer (ascending within
            a peer), int64.
        send_counts: rows sent to each peer.
        recv_counts: ``dY`` rows received from each peer.
        max_rows: the most rows any rank sends or receives (the same on every rank).
        split: the transpose's :class:`RowSplit`: rows = inner nodes ``j``, a column
            ``< num_inner`` a local ``i``, ``num_inner + k`` the ``k``-th received row.
        same_as_forward: whether these maps are the forward plan's (a symmetric pattern:
            then the rows go in the forward's order too).
    """

    send_index: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    max_rows: int
    split: RowSplit
    same_as_forward: bool
    _slices: dict[int, list[slicing.ExchangeSlice]] = field(default_factory=dict, repr=False)

    def slices(self, width: int, buffer_bytes: int) -> list[slicing.ExchangeSlice | None]:
        """The slices a ``width``-column exchange goes in (``[None]``: whole)."""
        return slicing.cached_slices(
            self._slices,
            self.send_index,
            self.send_counts,
            self.recv_counts,
            self.max_rows,
            width,
            buffer_bytes,
        )


def _exchange(comm: Communicator, rows: np.ndarray, send: list[int], recv: list[int]) -> np.ndarray:
    """A set-up all-to-all of float64 rows (exact for ids below 2^53 and float32 values)."""
    tensor = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
    return comm.alltoallv_start(tensor, send, recv, tag="setup").wait().numpy()


def reverse_plan(
    inner: CSRMatrix,
    halo: CSRMatrix | None,
    comm: Communicator,
    send_index: torch.Tensor,
    send_counts: list[int],
    recv_counts: list[int],
    global_ids: torch.Tensor | None,
) -> ReversePlan:
    """Build the :class:`ReversePlan` of a split operator and its halo plan's maps.

    A collective over ``comm`` (two all-to-alls and one all-reduce, at set-up) when it has
    more than one rank.

    Args:
        inner, halo: the split operator's blocks.
        comm: the communicator.
        send_index, send_counts, recv_counts: the forward plan's maps (halo row ``k`` of the
            block from peer ``q`` is ``q``'s row ``send_index[send_offsets[this rank] + k]``,
            so this rank's ``send_index`` names its own rows that peers hold as halo).
        global_ids: global id of every local node (inner, then halo), or ``None``.
    """
    n, size = inner.num_rows, comm.size
    num_halo = 0 if halo is None else halo.num_cols
    gids = local_global_ids(global_ids, n + num_halo)
    ri, ci, vi = _entries(inner)
    if size == 1:
        split = ordered_split(ci, ri, vi, gids[ri], n, n, n)
        empty = torch.zeros(0, dtype=torch.int64)
        return ReversePlan(empty, [0] * size, [0] * size, 0, split.to(inner.device), True)
    recv_off = np.concatenate([[0], np.cumsum(recv_counts)]).astype(np.int64)
    send_off = np.concatenate([[0], np.cumsum(send_counts)]).astype(np.int64)
    rh, ch, vh = _entries(halo)
    owner = np.repeat(np.arange(size, dtype=np.int64), np.diff(recv_off))[ch]
    wanted = owner * n + rh
    pairs = np.unique(wanted)  # (peer, row) sent, grouped by peer, rows ascending
    plan_index = send_index.cpu().numpy().astype(np.int64)
    forward = np.repeat(np.arange(size, dtype=np.int64), np.diff(send_off)) * n + plan_index
    by_forward = np.argsort(forward, kind="stable")
    same = np.array_equal(pairs, forward[by_forward])
    if same:  # a symmetric pattern: the forward's rows in the forward's order
        rows_sent = plan_index
        counts = np.asarray(send_counts, dtype=np.int64)
        position = by_forward[np.searchsorted(pairs, wanted)] - send_off[owner]
    else:
        rows_sent = pairs % max(n, 1)
        counts = np.bincount(pairs // max(n, 1), minlength=size).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        position = np.searchsorted(pairs, wanted) - offsets[owner]
    order = np.argsort(owner, kind="stable")
    records = np.stack(
        [
            position,
            ch - recv_off[owner],
            np.ones(rh.size, np.float32) if vh is None else vh,
            gids[rh],
        ],
        axis=1,
    )[order]
    entry_counts = np.bincount(owner, minlength=size).astype(np.int64)
    got = _exchange(comm, np.stack([counts, entry_counts], axis=1), [1] * size, [1] * size)
    rev_recv, recv_entries = got[:, 0].astype(np.int64), got[:, 1].astype(np.int64)
    got = _exchange(comm, records, entry_counts.tolist(), recv_entries.tolist())
    source = np.repeat(np.arange(size, dtype=np.int64), recv_entries)
    rev_off = np.concatenate([[0], np.cumsum(rev_recv)]).astype(np.int64)
    j_remote = plan_index[send_off[source] + got[:, 1].astype(np.int64)]
    c_remote = n + rev_off[source] + got[:, 0].astype(np.int64)
    rows = np.concatenate([ci, j_remote])
    cols = np.concatenate([ri, c_remote])
    vals = _values([vi, got[:, 2].astype(np.float32)], [ri.size, j_remote.size])
    keys = np.concatenate([gids[ri], got[:, 3].astype(np.int64)])
    del ri, ci, vi, rh, ch, vh, got, records, j_remote, c_remote  # the sort reads the copies
    split = ordered_split(rows, cols, vals, keys, n, n, n + int(rev_off[-1]))
    largest = float(max(int(counts.sum()), int(rev_recv.sum())))
    agreed = comm.allreduce_(torch.tensor([largest], dtype=torch.float64), "max", tag="setup")
    return ReversePlan(
        torch.from_numpy(rows_sent.astype(np.int64)),
        counts.tolist(),
        rev_recv.tolist(),
        int(agreed[0]),
        split.to(inner.device),
        bool(same),
    )
