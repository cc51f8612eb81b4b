"""Node blocks without METIS (:mod:`fullgraph.partition.rcm`): ``metis="rcm"`` and ``auto``'s
fallback where neither libmetis nor pymetis imports (the GPU machine has neither); the
partition written from them verifies, re-cut, and one process cuts the same blocks."""

from __future__ import annotations

import numpy as np
import pytest

import fullgraph.partition.blocks as blocks_mod
from fullgraph.partition import load_partition, partition_graph, verify_partitions, whole_graph_part
from fullgraph.partition.blocks import node_blocks
from fullgraph.partition.rcm import rcm_blocks


def test_rcm_blocks_are_equal_runs_none_empty(small_graph) -> None:
    n = small_graph.num_nodes
    for count in (1, 7, 64, n, n + 5):
        block = rcm_blocks(small_graph, count)
        sizes = np.bincount(block)
        assert len(sizes) == min(count, n) and sizes.min() >= 1
        assert sizes.max() - sizes.min() <= 1
        assert np.array_equal(block, rcm_blocks(small_graph, count))  # deterministic


@pytest.fixture
def fresh_cache():
    """The process's block cache emptied before and after (its ``auto`` entries are cut
    without METIS here)."""
    blocks_mod.BLOCK_CACHE.clear()
    yield
    blocks_mod.BLOCK_CACHE.clear()


def test_auto_falls_back_to_rcm_without_metis(
    small_graph, monkeypatch, tmp_path, fresh_cache
) -> None:
    def no_metis(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'pymetis'")

    want = node_blocks(small_graph, 8, metis="rcm")
    assert want.metis == "rcm"
    monkeypatch.setattr(blocks_mod, "metis_library", no_metis)
    notes: list[str] = []
    got = node_blocks(small_graph, 8, notes=notes)
    assert got.metis == "rcm" and np.array_equal(got.block, want.block)
    assert any("reverse Cuthill-McKee" in note for note in notes), notes
    with pytest.raises(ModuleNotFoundError):  # an explicit library is not replaced
        blocks_mod.BLOCK_CACHE.clear()
        node_blocks(small_graph, 8, metis="pymetis")
    # a partition of such blocks verifies (re-cut with rcm) and one process cuts the same
    partition_graph(small_graph, 3, tmp_path / "p", block_size=8)
    verify_partitions(tmp_path / "p", graph=small_graph)
    part = load_partition(tmp_path / "p", 1)
    whole = whole_graph_part(small_graph, block_size=8)
    assert part.num_blocks == whole.num_blocks
    first = whole.global_ids[whole.block_rows[whole.block_ptr[0] : whole.block_ptr[1]]]
    assert set(first.tolist()) == set(np.flatnonzero(want.block == 0).tolist())
