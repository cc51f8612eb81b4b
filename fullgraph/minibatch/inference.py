"""Exact layer-wise full-neighbour inference of the mini-batch GraphSAGE, in bounded memory.

Evaluation runs every layer over every node with the full mean adjacency (no sampling), as
before; only the way the rows are held changed, so that no rank ever holds an ``N x H`` matrix:

- rank ``r`` owns the contiguous rows :func:`row_range` ``(N, r, P)`` and keeps only those rows
  of each layer's output, ``[N/P, H]``;
- the next layer's neighbour sums are accumulated one column chunk at a time: the owner of
  each chunk of at most ``chunk_rows`` rows broadcasts them, and every rank adds them into the
  rows that have those neighbours. The columns of a CSR row are sorted, so a per-row cursor
  walks each row once over all the chunks (:func:`_accumulate`); the graph's arrays are only
  read, memory-mapped ones in place;
- the dense transforms run in row blocks.

The first layer reads the input features of every node directly (every rank has them, e.g.
memory-mapped) and needs no communication when it aggregates first. A layer aggregates first
or transforms first by the whole graph's cost (transform first iff it narrows), the same choice
on every rank.

Peak per rank: the layer's input rows ``[N/P, d_in]``, its neighbour sums ``[N/P, min(d_in,
d_out)]``, its output rows when they cannot overwrite the sums, and one chunk. A row's neighbour
terms are added in ascending source order in float32 whatever P and the chunk size, as the CSR
kernel adds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.kernels.cpu_launch import numba_launch, row_ranges
from fullgraph.models.gnn import GNN

#: Values (rows x width) of one broadcast chunk, and of one block of the dense transforms.
CHUNK_VALUES = 1 << 24
BLOCK_VALUES = 1 << 22


def row_range(num_nodes: int, rank: int, size: int) -> tuple[int, int]:
    """The contiguous rows ``[lo, hi)`` rank ``rank`` computes in layer-wise inference."""
    bounds = np.linspace(0, num_nodes, size + 1).round().astype(np.int64)
    return int(bounds[rank]), int(bounds[rank + 1])


@numba.njit(cache=True, nogil=True)
def _rows_sorted(indptr, indices, lo, hi):  # pragma: no cover - compiled by numba
    """True iff the columns of every row in ``[lo, hi)`` are non-decreasing."""
    for r in range(lo, hi):
        for e in range(indptr[r] + 1, indptr[r + 1]):
            if indices[e] < indices[e - 1]:
                return False
    return True


@numba.njit(parallel=True, cache=True, nogil=True)
def _accumulate(
    indptr, indices, cursor, col_hi, col0, weights, x, out, bounds
):  # pragma: no cover - compiled by numba
    """Add ``weights[r] * x[u - col0]`` into ``out[r]`` for the entries ``u < col_hi`` of row ``r``
    from ``cursor[r]`` on, and advance the cursor past them.

    ``indptr`` holds the rows' global entry offsets ``[num_rows + 1]``; ``bounds`` splits the
    rows into ranges run in parallel.
    """
    nf = x.shape[1]
    for c in numba.prange(bounds.shape[0] - 1):
        for r in range(bounds[c], bounds[c + 1]):
            e = cursor[r]
            end = indptr[r + 1]
            w = weights[r]
            acc = out[r]
            while e < end and indices[e] < col_hi:
                xr = x[indices[e] - col0]
                for f in range(nf):
                    acc[f] += w * xr[f]
                e += 1
            cursor[r] = e


@dataclass
class RowOperator:
    """The mean-normalised incoming-edge rows ``[lo, hi)`` of a whole graph, read in place.

    Shapes:
        - ``indptr``: int64 [hi - lo + 1], offsets into ``indices`` (global, not from 0)
        - ``indices``: int64, the graph's sources (possibly memory-mapped), sorted in a row
        - ``weights``: float32 [hi - lo], ``1 / in-degree`` (1 for isolated rows)
    """

    lo: int
    hi: int
    num_nodes: int
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int) -> RowOperator:
        """The operator of rows ``[lo, hi)`` of the CSR ``(indptr, indices)``.

        No copy is made when the rows' columns are sorted (what every loader returns);
        otherwise only these rows are copied, sorted.
        """
        indptr = np.asarray(indptr).astype(np.int64, copy=False)
        indices = np.asarray(indices).astype(np.int64, copy=False)
        ptr = np.array(indptr[lo : hi + 1], dtype=np.int64)
        if not _rows_sorted(indptr, indices, lo, hi):
            start, stop = int(ptr[0]), int(ptr[-1])
            rows = np.repeat(np.arange(hi - lo, dtype=np.int64), np.diff(ptr))
            own = np.array(indices[start:stop], dtype=np.int64)
            indices = own[np.lexsort((own, rows))]
            ptr -= start
        counts = np.diff(ptr).astype(np.float32)
        weights = np.float32(1.0) / np.maximum(counts, np.float32(1.0))
        return cls(lo, hi, int(indptr.shape[0] - 1), ptr, indices, weights)

    @property
    def num_rows(self) -> int:
        """Rows this operator computes (``hi - lo``)."""
        return self.hi - self.lo


def _as_numpy(x: np.ndarray | torch.Tensor) -> np.ndarray:
    return x.detach().numpy() if isinstance(x, torch.Tensor) else x


def _blocks(num_rows: int, width: int) -> list[tuple[int, int]]:
    step = max(1, BLOCK_VALUES // max(width, 1))
    return [(s, min(s + step, num_rows)) for s in range(0, num_rows, step)]


def _rows_tensor(x: np.ndarray, lo: int, hi: int) -> torch.Tensor:
    """Rows ``[lo, hi)`` of ``x`` as a tensor (copied when ``x`` is read-only, e.g. mapped)."""
    block = x[lo:hi]
    return torch.from_numpy(np.array(block) if not block.flags.writeable else block)


def _add_root(out: torch.Tensor, root: torch.nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """``out += root(h)`` without a temporary of ``out``'s size; returns ``out``."""
    out.addmm_(h, root.weight.t())
    if root.bias is not None:
        out.add_(root.bias)
    return out


def _neighbour_sums(
    op: RowOperator,
    comm: Communicator,
    width: int,
    *,
    mine: np.ndarray | None = None,
    everywhere: np.ndarray | None = None,
    chunk_rows: int | None = None,
) -> np.ndarray:
    """``A[lo:hi] @ S`` for a source ``S`` [N, width] that the ranks hold by rows, or that every
    rank holds whole (``everywhere``: no communication).

    Args:
        op: this rank's rows.
        comm: the communicator; all ranks call together with the same ``width``.
        width: the source's width.
        mine: this rank's rows of ``S`` (the rows of :func:`row_range`).
        everywhere: the whole ``S``, available on every rank.
        chunk_rows: rows per broadcast (default :data:`CHUNK_VALUES` / ``width``).

    Returns:
        float32 [hi - lo, width].
    """
    with numba_launch(chunksize=None) as threads:
        bounds = row_ranges(op.indptr - op.indptr[0], threads, per_thread=4)
        out = np.zeros((op.num_rows, width), dtype=np.float32)
        cursor = op.indptr[:-1].copy()
        n = op.num_nodes
        if everywhere is not None:
            _accumulate(op.indptr, op.indices, cursor, n, 0, op.weights, everywhere, out, bounds)
            return out
        step = chunk_rows or max(1, CHUNK_VALUES // max(width, 1))
        buf = np.empty((min(step, n), width), dtype=np.float32)
        for q in range(comm.size):
            qlo, qhi = row_range(n, q, comm.size)
            for c0 in range(qlo, qhi, step):
                c1 = min(c0 + step, qhi)
                if q == comm.rank:
                    src = np.ascontiguousarray(mine[c0 - op.lo : c1 - op.lo])
                    comm.bytes_sent["eval"] += (comm.size - 1) * src.nbytes
                else:
                    src = buf[: c1 - c0]
                if comm.size > 1:
                    comm.broadcast_(torch.from_numpy(src), root=q)
                _accumulate(op.indptr, op.indices, cursor, c1, c0, op.weights, src, out, bounds)
        return out


@torch.no_grad()
def layerwise_inference(
    model: GNN,
    op: RowOperator,
    x: np.ndarray | torch.Tensor,
    comm: Communicator,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Logits of this rank's rows from full-graph, layer-by-layer inference (no dropout).

    Args:
        model: a ``sage`` :class:`GNN` (in eval mode).
        op: :meth:`RowOperator.of` this rank's :func:`row_range`.
        x: input features of all nodes [N, F] (read in place; may be memory-mapped).
        comm: the communicator (every rank must call this together).
        chunk_rows: rows per broadcast chunk (default: about 64 MB of float32).

    Returns:
        float [hi - lo, num_classes] for this rank's rows.

    Raises:
        ValueError: not a sage model, or ``op`` holds other rows than this rank computes.
    """
    if model.kind != "sage":
        raise ValueError(f"mini-batch inference needs a sage model, got {model.kind!r}")
    lo, hi = op.lo, op.hi
    if (lo, hi) != row_range(op.num_nodes, comm.rank, comm.size):
        raise ValueError(
            f"the operator holds rows [{lo}, {hi}), rank {comm.rank} of {comm.size} computes "
            f"rows {list(row_range(op.num_nodes, comm.rank, comm.size))}"
        )
    x = _as_numpy(x)
    rows = op.num_rows
    h: np.ndarray | None = None  # this rank's rows of the current layer's input
    for i, layer in enumerate(model.layers):
        lin, root = layer.lin, layer.root
        d_in, d_out = lin.in_features, lin.out_features
        last = i == model.num_layers - 1
        src = x[lo:hi] if h is None else h  # this rank's rows of the layer's input

        def h_rows(a: int, b: int, src: np.ndarray = src) -> torch.Tensor:
            return _rows_tensor(src, a, b)

        if d_out < d_in:  # transform first: the narrower rows travel and are summed
            z = np.empty((rows, d_out), dtype=np.float32)
            for a, b in _blocks(rows, d_in):
                torch.mm(h_rows(a, b), lin.weight.t(), out=torch.from_numpy(z[a:b]))
            out = _neighbour_sums(op, comm, d_out, mine=z, chunk_rows=chunk_rows)
            del z
            for a, b in _blocks(rows, d_in):
                o = torch.from_numpy(out[a:b])
                _add_root(o.add_(lin.bias), root, h_rows(a, b))
        else:  # aggregate first; the first layer's input is on every rank
            if h is None:
                sums = _neighbour_sums(op, comm, d_in, everywhere=x)
            else:
                sums = _neighbour_sums(op, comm, d_in, mine=h, chunk_rows=chunk_rows)
            # the output overwrites the sums block by block when the width allows
            in_place = d_out == d_in
            out = sums if in_place else np.empty((rows, d_out), dtype=np.float32)
            for a, b in _blocks(rows, max(d_in, d_out)):
                s, o = torch.from_numpy(sums[a:b]), torch.from_numpy(out[a:b])
                if in_place:
                    t = _add_root(torch.addmm(lin.bias, s, lin.weight.t()), root, h_rows(a, b))
                    o.copy_(t)
                else:
                    torch.addmm(lin.bias, s, lin.weight.t(), out=o)
                    _add_root(o, root, h_rows(a, b))
            del sums
        if not last:
            np.maximum(out, 0, out=out)
        h = out
    assert h is not None  # a GNN has at least one layer
    return torch.from_numpy(h)
