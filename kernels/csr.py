"""The sparse operator every aggregation uses: a CSR matrix built once per graph.

A :class:`CSRMatrix` holds ``indptr`` (int64), ``indices`` (int32 or int64, as given) and
optional float32 ``values`` (``None`` means every stored entry is 1) as torch tensors. Rows and
columns may differ: a partition's matrix has its inner nodes as rows and inner + halo nodes as
columns. The transpose, which the backward pass of :func:`fullgraph.kernels.spmm` needs, is
built on first use by :meth:`CSRMatrix.t` and kept on the object.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch

from fullgraph.errors import DataError

ArrayLike = np.ndarray | torch.Tensor


def _as_tensor(a: ArrayLike, name: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.detach()
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a))
    raise DataError(f"CSRMatrix: {name} must be a numpy array or torch tensor, got {type(a)}")


class CSRMatrix:
    """A sparse matrix in CSR form, with its transpose cached for the backward pass.

    Args:
        indptr: row pointers, integer [num_rows + 1], starting at 0, non-decreasing.
        indices: column of every stored entry, int32 or int64 [nnz] (the dtype is kept).
        values: weight of every entry, [nnz] (stored as float32), or ``None`` for all ones.
        num_cols: number of columns; default ``max(num_rows, max(indices) + 1)``.

    Shapes:
        - ``indptr``: int64 [num_rows + 1]
        - ``indices``: int32 or int64 [nnz]
        - ``values``: float32 [nnz] or ``None``

    Raises:
        DataError: when the arrays do not form a valid CSR matrix (the message names the problem).
    """

    def __init__(
        self,
        indptr: ArrayLike,
        indices: ArrayLike,
        values: ArrayLike | None = None,
        num_cols: int | None = None,
    ) -> None:
        ip = _as_tensor(indptr, "indptr")
        ix = _as_tensor(indices, "indices")
        if ip.dim() != 1 or ip.numel() < 1:
            raise DataError(f"CSRMatrix: indptr must be 1-D with >= 1 entry, got {tuple(ip.shape)}")
        if ix.dim() != 1:
            raise DataError(f"CSRMatrix: indices must be 1-D, got shape {tuple(ix.shape)}")
        if ip.dtype.is_floating_point or ix.dtype not in (torch.int32, torch.int64):
            raise DataError(f"CSRMatrix: indices must be int32 or int64, got {ix.dtype}")
        ip = ip.to(torch.int64).contiguous()
        ix = ix.contiguous()
        nnz = ix.numel()
        if int(ip[0]) != 0 or int(ip[-1]) != nnz:
            raise DataError(
                f"CSRMatrix: indptr must start at 0 and end at nnz={nnz}, "
                f"got {int(ip[0])}..{int(ip[-1])}"
            )
        if ip.numel() > 1 and bool((ip[1:] < ip[:-1]).any()):
            raise DataError("CSRMatrix: indptr is decreasing somewhere")
        num_rows = ip.numel() - 1
        max_index = int(ix.max()) if nnz else -1
        if nnz and int(ix.min()) < 0:
            raise DataError(f"CSRMatrix: negative column index {int(ix.min())}")
        if num_cols is None:
            num_cols = max(num_rows, max_index + 1)
        if max_index >= num_cols:
            raise DataError(f"CSRMatrix: column index {max_index} >= num_cols={num_cols}")
        if values is not None:
            v = _as_tensor(values, "values").to(torch.float32).contiguous()
            if v.shape != (nnz,):
                raise DataError(f"CSRMatrix: values has shape {tuple(v.shape)}, expected ({nnz},)")
            values = v
        self._init(ip, ix, values, num_rows, int(num_cols))

    def _init(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: torch.Tensor | None,
        num_rows: int,
        num_cols: int,
    ) -> None:
        self.indptr = indptr
        self.indices = indices
        self.values = values
        self.num_rows = num_rows
        self.num_cols = num_cols
        self._transpose: CSRMatrix | None = None

    @classmethod
    def _trusted(
        cls,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: torch.Tensor | None,
        num_rows: int,
        num_cols: int,
    ) -> CSRMatrix:
        """Build from tensors already known to be valid (no checks, no copies)."""
        obj = cls.__new__(cls)
        obj._init(indptr, indices, values, num_rows, num_cols)
        return obj

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self.indices.numel())

    @property
    def shape(self) -> tuple[int, int]:
        """``(num_rows, num_cols)``."""
        return (self.num_rows, self.num_cols)

    @property
    def device(self) -> torch.device:
        """Device holding the arrays."""
        return self.indices.device

    def __repr__(self) -> str:
        return (
            f"CSRMatrix(num_rows={self.num_rows}, num_cols={self.num_cols}, nnz={self.nnz}, "
            f"index_dtype={self.indices.dtype}, weighted={self.values is not None}, "
            f"device={self.device})"
        )

    def row_of_entry(self) -> torch.Tensor:
        """Row of every stored entry, int64 [nnz]."""
        counts = self.indptr[1:] - self.indptr[:-1]
        rows = torch.arange(self.num_rows, device=self.device, dtype=torch.int64)
        return torch.repeat_interleave(rows, counts)

    def row_nnz(self) -> torch.Tensor:
        """Number of stored entries of every row, int64 [num_rows]."""
        return self.indptr[1:] - self.indptr[:-1]

    def row_block(self, start: int, stop: int) -> CSRMatrix:
        """Rows ``start:stop`` as a CSRMatrix sharing this matrix's index and value storage.

        Only the row pointers of the block are new (rebased to start at 0).
        """
        if not 0 <= start <= stop <= self.num_rows:
            raise DataError(f"CSRMatrix: row block {start}:{stop} outside 0:{self.num_rows}")
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return CSRMatrix._trusted(
            self.indptr[start : stop + 1] - lo,
            self.indices[lo:hi],
            None if self.values is None else self.values[lo:hi],
            stop - start,
            self.num_cols,
        )

    def entries_of_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Bool mask over the stored entries: those in the rows where ``rows`` (bool
        [num_rows]) holds."""
        return torch.repeat_interleave(rows.to(self.device), self.row_nnz())

    def select_rows(self, rows: torch.Tensor) -> CSRMatrix:
        """The rows where ``rows`` (bool [num_rows]) holds, the others emptied: same shape,
        kept rows keep their entries and order; indices keep their dtype."""
        keep_row = torch.as_tensor(rows, dtype=torch.bool, device=self.device)
        if keep_row.shape != (self.num_rows,):
            raise DataError(
                f"CSRMatrix.select_rows: mask of {tuple(keep_row.shape)} for {self.num_rows} rows"
            )
        counts = torch.where(keep_row, self.row_nnz(), 0)
        indptr = torch.zeros(self.num_rows + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        keep = self.entries_of_rows(keep_row)
        return CSRMatrix._trusted(
            indptr,
            self.indices[keep],
            None if self.values is None else self.values[keep],
            self.num_rows,
            self.num_cols,
        )

    def select_columns(self, columns: torch.Tensor) -> CSRMatrix:
        """The given columns (distinct, ascending) as a new matrix: its column ``j`` is column
        ``columns[j]`` here. Rows keep their entries' order; indices keep their dtype."""
        cols = torch.as_tensor(columns, dtype=torch.int64, device=self.device)
        position = torch.full((self.num_cols,), -1, dtype=torch.int64, device=self.device)
        position[cols] = torch.arange(cols.numel(), dtype=torch.int64, device=self.device)
        mapped = position[self.indices.to(torch.int64)]
        del position
        keep = mapped >= 0
        before = torch.zeros(self.nnz + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(keep, 0, out=before[1:])
        return CSRMatrix._trusted(
            before[self.indptr],  # entries kept before each row's start
            mapped[keep].to(self.indices.dtype),
            None if self.values is None else self.values[keep],
            self.num_rows,
            int(cols.numel()),
        )

    def sorted_by_column(self) -> CSRMatrix:
        """This matrix with every row's entries in ascending column order (``self`` if already).

        A stable sort: duplicate entries keep their order.
        """
        if self.nnz < 2:
            return self
        key = self.row_of_entry() * self.num_cols + self.indices.to(torch.int64)
        if bool((key[1:] >= key[:-1]).all()):
            return self
        order = torch.argsort(key, stable=True)
        del key
        return CSRMatrix._trusted(
            self.indptr,
            self.indices[order],
            None if self.values is None else self.values[order],
            self.num_rows,
            self.num_cols,
        )

    def to_scipy(self) -> sp.csr_matrix:
        """A scipy CSR copy (values of ones when unweighted)."""
        data = np.ones(self.nnz, np.float32) if self.values is None else self.values.cpu().numpy()
        return sp.csr_matrix(
            (data, self.indices.cpu().numpy(), self.indptr.cpu().numpy()), shape=self.shape
        )

    def to_torch_sparse(self) -> torch.Tensor:
        """A ``torch.sparse_csr`` tensor with the same entries (float32)."""
        data = self.values
        if data is None:
            data = torch.ones(self.nnz, dtype=torch.float32, device=self.device)
        with warnings.catch_warnings():  # torch's "sparse CSR support is in beta" notice
            warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support.*")
            return torch.sparse_csr_tensor(
                self.indptr,
                self.indices.to(torch.int64),
                data,
                size=self.shape,
                check_invariants=False,
            )

    def t(self) -> CSRMatrix:
        """The transpose as a CSRMatrix (built once, then cached on both matrices).

        Returns:
            CSRMatrix of shape ``(num_cols, num_rows)`` with the same index dtype.
        """
        if self._transpose is None:
            tr = self.transposed()
            tr._transpose = self
            self._transpose = tr
        return self._transpose

    def without_empty_rows(self) -> tuple[torch.Tensor, CSRMatrix]:
        """The rows holding entries, and the matrix of those rows only.

        Returns:
            ``(rows, compact)``: int64 row ids (ascending) and the CSRMatrix whose row ``i`` is
            row ``rows[i]`` here (same columns, entries, index dtype).
        """
        counts = self.row_nnz()
        rows = torch.nonzero(counts, as_tuple=True)[0]
        indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts[rows], 0, out=indptr[1:])
        return rows, CSRMatrix._trusted(
            indptr, self.indices, self.values, int(rows.numel()), self.num_cols
        )

    def transposed(self) -> CSRMatrix:
        """The transpose as a new matrix, not cached (neither matrix keeps the other alive).

        Returns:
            CSRMatrix of shape ``(num_cols, num_rows)`` with the same index dtype.
        """
        n = self.nnz
        perm_dtype = np.int32 if n < 2**31 else np.int64
        perm = np.arange(n, dtype=perm_dtype)
        csr = sp.csr_matrix(
            (perm, self.indices.cpu().numpy(), self.indptr.cpu().numpy()), shape=self.shape
        )
        csc = csr.tocsc()  # counting sort by column, O(nnz)
        if not csc.has_sorted_indices:
            csc.sort_indices()
        order = torch.from_numpy(csc.data.astype(np.int64, copy=False))
        t_indptr = torch.from_numpy(csc.indptr.astype(np.int64))
        t_indices = torch.from_numpy(csc.indices.astype(np.int64)).to(self.indices.dtype)
        t_values = None if self.values is None else self.values.cpu()[order]
        return CSRMatrix._trusted(
            t_indptr.to(self.device),
            t_indices.to(self.device),
            None if t_values is None else t_values.to(self.device),
            self.num_cols,
            self.num_rows,
        )

    def to(self, device: torch.device | str) -> CSRMatrix:
        """A copy on ``device`` (its cached transpose moves too); ``self`` when already there."""
        device = torch.device(device)
        if self.device == device or (device.type == self.device.type and device.index is None):
            return self
        moved = CSRMatrix._trusted(
            self.indptr.to(device),
            self.indices.to(device),
            None if self.values is None else self.values.to(device),
            self.num_rows,
            self.num_cols,
        )
        if self._transpose is not None:
            tr = self._transpose
            moved._transpose = CSRMatrix._trusted(
                tr.indptr.to(device),
                tr.indices.to(device),
                None if tr.values is None else tr.values.to(device),
                tr.num_rows,
                tr.num_cols,
            )
            moved._transpose._transpose = moved
        return moved

    def with_indices(self, dtype: torch.dtype) -> CSRMatrix:
        """A copy whose column indices have ``dtype`` (torch.int32 or torch.int64)."""
        if dtype not in (torch.int32, torch.int64):
            raise DataError(f"CSRMatrix: index dtype must be int32 or int64, got {dtype}")
        if dtype == torch.int32 and self.num_cols >= 2**31:
            raise DataError(f"CSRMatrix: {self.num_cols} columns do not fit int32 indices")
        return CSRMatrix._trusted(
            self.indptr, self.indices.to(dtype), self.values, self.num_rows, self.num_cols
        )

    def with_values(self, values: torch.Tensor | None) -> CSRMatrix:
        """A copy with the same pattern and new ``values`` (float32 [nnz] or ``None``)."""
        if values is not None:
            values = values.to(device=self.device, dtype=torch.float32).contiguous()
            if values.shape != (self.nnz,):
                raise DataError(
                    f"CSRMatrix: values has shape {tuple(values.shape)}, expected ({self.nnz},)"
                )
        return CSRMatrix._trusted(self.indptr, self.indices, values, self.num_rows, self.num_cols)

    def with_self_loops(self) -> CSRMatrix:
        """A new matrix with entry ``(i, i)`` (value 1) appended to every row ``i``.

        An existing diagonal entry is not looked for: loaders remove self loops, and a duplicate
        entry would simply add. Needs ``num_cols >= num_rows`` (a partition's inner node ``i``
        has local column ``i``).
        """
        n = self.num_rows
        if self.num_cols < n:
            raise DataError(f"CSRMatrix.with_self_loops: num_cols={self.num_cols} < num_rows={n}")
        dev = self.device
        new_indptr = self.indptr + torch.arange(n + 1, device=dev, dtype=torch.int64)
        loop_pos = new_indptr[1:] - 1
        keep = torch.ones(self.nnz + n, dtype=torch.bool, device=dev)
        keep[loop_pos] = False
        new_indices = torch.empty(self.nnz + n, dtype=self.indices.dtype, device=dev)
        new_indices[keep] = self.indices
        new_indices[loop_pos] = torch.arange(n, device=dev, dtype=self.indices.dtype)
        new_values = None
        if self.values is not None:
            new_values = torch.ones(self.nnz + n, dtype=torch.float32, device=dev)
            new_values[keep] = self.values
        return CSRMatrix._trusted(new_indptr, new_indices, new_values, n, self.num_cols)

    def gcn_normalized(self, row_degree: ArrayLike, col_degree: ArrayLike) -> CSRMatrix:
        """A new matrix with ``values[e] = 1 / sqrt(row_degree[r] * col_degree[c])``.

        PyG ``GCNConv`` semantics: pass degrees that include the self loop (``+1``) and, in a
        partition, the GLOBAL degrees of the local nodes. Existing values are replaced; an entry
        touching a zero degree gets weight 0.

        Args:
            row_degree: degree of every row node, [num_rows].
            col_degree: degree of every column node, [num_cols].
        """
        rd = _as_tensor(row_degree, "row_degree").to(device=self.device, dtype=torch.float64)
        cd = _as_tensor(col_degree, "col_degree").to(device=self.device, dtype=torch.float64)
        if rd.shape != (self.num_rows,) or cd.shape != (self.num_cols,):
            raise DataError(
                f"CSRMatrix.gcn_normalized: degrees of shape {tuple(rd.shape)} and "
                f"{tuple(cd.shape)}, expected ({self.num_rows},) and ({self.num_cols},)"
            )
        if bool((rd < 0).any()) or bool((cd < 0).any()):
            raise DataError("CSRMatrix.gcn_normalized: negative degree")
        rinv = torch.where(rd > 0, rd.rsqrt(), torch.zeros_like(rd))
        cinv = torch.where(cd > 0, cd.rsqrt(), torch.zeros_like(cd))
        vals = rinv[self.row_of_entry()] * cinv[self.indices.to(torch.int64)]
        return self.with_values(vals.to(torch.float32))

    def mean_normalized(self) -> CSRMatrix:
        """A new matrix with ``values[e] = 1 / nnz(row of e)`` (GraphSAGE mean; empty rows stay 0).

        Existing values are replaced.
        """
        counts = self.row_nnz().to(torch.float32)
        inv = 1.0 / counts.clamp(min=1.0)
        return self.with_values(inv[self.row_of_entry()])
