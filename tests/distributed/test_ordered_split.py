"""``ordered_split`` sorts a chunk of whole rows at a time (its memory no longer grows with the
operator beyond one int64 per entry): the splits equal those of one sort over every entry, the
definition of the order (rows, then the key, then the value, then the input order), with
chunks smaller than a row, a chunk per row, empty rows, duplicate keys and values, and
without values.

Enters through :mod:`fullgraph.distributed.ordered`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fullgraph.distributed import ordered


def _one_sort(rows, cols, vals, keys, num_rows, num_local):
    """The order as one sort over every entry: (row, col, val) in the splits' row order."""
    sort_keys = [keys, rows] if vals is None else [vals, keys, rows]
    order = np.lexsort(sort_keys)
    rows, cols = rows[order], cols[order]
    vals = None if vals is None else vals[order]
    remote = np.zeros(num_rows, dtype=bool)
    remote[rows[cols >= num_local]] = True
    out = []
    for mask in (~remote, remote):
        entries = mask[rows]
        out.append((rows[entries], cols[entries], None if vals is None else vals[entries]))
    return out


def _entries(split: ordered.RowSplit, which: str):
    """(row, col, val) of one side of a split, row ids mapped back to the operator's."""
    keep = getattr(split, f"{which}_rows").numpy()
    csr = getattr(split, which)
    ptr = csr.indptr.numpy()
    rows = np.repeat(keep, np.diff(ptr))
    vals = None if csr.values is None else csr.values.numpy()
    return rows, csr.indices.numpy().astype(np.int64), vals


@pytest.mark.parametrize("chunk", [1, 3, 50, 1 << 20])
@pytest.mark.parametrize("weighted", [True, False])
def test_chunked_sort_equals_one_sort(monkeypatch, chunk: int, weighted: bool) -> None:
    rng = np.random.default_rng(chunk)
    num_rows, num_local, num_cols, m = 40, 30, 45, 600
    rows = rng.integers(0, num_rows - 5, m)  # the last rows stay empty
    cols = rng.integers(0, num_cols, m)
    keys = rng.integers(0, 12, m)  # many ties
    vals = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), m) if weighted else None
    monkeypatch.setattr(ordered, "SORT_CHUNK", chunk)
    split = ordered.ordered_split(rows, cols, vals, keys, num_rows, num_local, num_cols)
    want = _one_sort(rows, cols, vals, keys, num_rows, num_local)
    for side, (r, c, v) in zip(("interior", "boundary"), want, strict=True):
        got_r, got_c, got_v = _entries(split, side)
        assert np.array_equal(got_r, r) and np.array_equal(got_c, c)
        assert (got_v is None) == (v is None)
        if v is not None:
            assert np.array_equal(got_v, v)
    assert split.interior.indices.dtype == torch.int32 == split.boundary.indices.dtype
    assert split.interior.num_cols == num_local and split.boundary.num_cols == num_cols
    # the empty rows are interior rows without entries
    assert set(range(num_rows - 5, num_rows)) <= set(split.interior_rows.tolist())


def test_row_chunks_cover_every_row_once() -> None:
    indptr = np.array([0, 0, 5, 5, 6, 20, 21], dtype=np.int64)
    for chunk in (1, 2, 7, 100):
        bounds = ordered._row_chunks(indptr, chunk)
        assert bounds[0] == 0 and bounds[-1] == 6 and np.all(np.diff(bounds) > 0)
    assert ordered._row_chunks(np.zeros(1, np.int64), 4).tolist() == [0]
