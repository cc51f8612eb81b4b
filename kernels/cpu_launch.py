"""How the numba CPU kernels get their threads: one process setting, one launch preamble.

- :func:`set_threads`: a rank's compute threads, numba's and torch's (the rank start-up, the
  memory plan's floor, the benchmarks);
- :func:`numba_launch`: around every parallel numba kernel: numba's threads follow torch's
  setting (:func:`thread_count`) and the ``prange`` iterations are handed out one at a time
  (the kernels split their rows into more ranges than threads, so a busy core delays less);
- :func:`row_ranges`: the rows of a CSR split for those threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numba
import numpy as np
import torch

#: Row ranges per thread, handed out dynamically (a busy core then delays less than 1/threads).
RANGES_PER_THREAD = 8


def thread_count() -> int:
    """Threads the numba kernels use: torch's setting, capped by numba's pool size."""
    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def set_threads(threads: int) -> None:
    """Set this process's compute threads, numba's (capped by its pool) and torch's.

    numba's first: launching its OpenMP pool can reset the count torch reads
    (``torch.get_num_threads()`` went from 1 back to 2 when torch had already run).
    """
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)


@contextlib.contextmanager
def numba_launch(chunksize: int | None = 1) -> Iterator[int]:
    """Run the body's numba kernels on :func:`thread_count` threads; yields that count.

    Args:
        chunksize: ``prange`` iterations a thread takes at a time inside the body (restored
            after it); ``None`` leaves numba's setting (static scheduling).
    """
    threads = thread_count()
    numba.set_num_threads(threads)
    if chunksize is None:
        yield threads
        return
    previous = numba.set_parallel_chunksize(chunksize)
    try:
        yield threads
    finally:
        numba.set_parallel_chunksize(previous)


def balanced_row_ranges(indptr: np.ndarray, parts: int) -> np.ndarray:
    """Split rows into ``parts`` consecutive ranges with about equal non-zeros.

    Args:
        indptr: int64 [num_rows + 1].
        parts: number of ranges.

    Returns:
        int64 [parts + 1] row boundaries (first 0, last num_rows).
    """
    nnz = int(indptr[-1])
    num_rows = indptr.shape[0] - 1
    # Weight rows by nnz + 1 so that runs of empty rows are spread too.
    targets = np.linspace(0, nnz + num_rows, parts + 1)
    work = indptr + np.arange(num_rows + 1, dtype=np.int64)
    bounds = np.searchsorted(work, targets).astype(np.int64)
    bounds[0], bounds[-1] = 0, num_rows
    return np.maximum.accumulate(bounds)


def row_ranges(indptr: np.ndarray, threads: int, per_thread: int = RANGES_PER_THREAD) -> np.ndarray:
    """:func:`balanced_row_ranges` for ``threads`` threads: ``per_thread`` ranges each (one
    range for one thread)."""
    return balanced_row_ranges(indptr, threads * per_thread if threads > 1 else 1)
