"""The numba kernels' one launch preamble and the process's thread setting (kernels/cpu_launch)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from mp_utils import threads_restored

from fullgraph.kernels.backend import numba_or_torch
from fullgraph.kernels.cpu_launch import (
    RANGES_PER_THREAD,
    numba_launch,
    row_ranges,
    set_threads,
    thread_count,
)


@pytest.fixture
def saved_threads():
    with threads_restored():
        yield


def test_set_threads_sets_numba_and_torch(saved_threads) -> None:
    set_threads(1)
    assert (torch.get_num_threads(), numba.get_num_threads()) == (1, 1)
    set_threads(10_000)  # numba's pool caps its count; torch takes any
    assert torch.get_num_threads() == 10_000
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    assert thread_count() == numba.config.NUMBA_NUM_THREADS


def test_numba_launch_follows_torch_and_restores_the_chunk_size(saved_threads) -> None:
    torch.set_num_threads(1)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    before = numba.get_parallel_chunksize()
    with numba_launch() as threads:
        assert threads == 1 == numba.get_num_threads()
        assert numba.get_parallel_chunksize() == 1
    assert numba.get_parallel_chunksize() == before
    with pytest.raises(ValueError), numba_launch(chunksize=3):
        assert numba.get_parallel_chunksize() == 3
        raise ValueError
    assert numba.get_parallel_chunksize() == before
    with numba_launch(chunksize=None):
        assert numba.get_parallel_chunksize() == before


def test_row_ranges_split_the_rows_per_thread() -> None:
    indptr = np.cumsum([0, *([3] * 100)]).astype(np.int64)
    assert row_ranges(indptr, 1).tolist() == [0, 100]
    bounds = row_ranges(indptr, 2)
    assert bounds.shape == (2 * RANGES_PER_THREAD + 1,) and bounds[-1] == 100
    assert np.all(np.diff(bounds) >= 0)
    assert row_ranges(indptr, 3, per_thread=2).shape == (7,)


@pytest.mark.parametrize(
    ("dtype", "kernel", "want"),
    [
        (torch.float32, "cpu", "numba"),
        (torch.float64, "cpu", "numba"),
        (torch.bfloat16, "cpu", "torch"),
        (torch.float32, "torch", "torch"),
    ],
)
def test_numba_or_torch(monkeypatch, dtype, kernel, want) -> None:
    monkeypatch.setenv("FULLGRAPH_KERNEL", kernel)
    assert numba_or_torch(torch.device("cpu"), dtype, "segment_max") == want
