"""The process's cache of node blocks: the same input gets the same bits without METIS, a
changed input misses, the least recently used input goes first."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

import fullgraph.partition.blocks as blocks_module
from fullgraph.partition.block_cache import BLOCK_CACHE, BlockCache, CachedBlocks, blocks_key
from fullgraph.partition.blocks import node_blocks


@pytest.fixture
def graph(make_graph):
    """A fresh 500-node graph (block size 1), the cache emptied around the test."""
    BLOCK_CACHE.clear()
    yield make_graph(num_nodes=500, num_blocks=6, avg_degree=8, seed=11)
    BLOCK_CACHE.clear()


@pytest.fixture
def count_cuts(monkeypatch):
    """``cuts`` (a list) gets one entry for every cut METIS makes through :func:`node_blocks`."""
    cuts: list[int] = []
    real = blocks_module._cut_blocks

    def counted(*args, **kwargs):
        cuts.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(blocks_module, "_cut_blocks", counted)
    return cuts


def uncached(graph, *args, **kwargs):
    """``node_blocks`` with the cache emptied first: METIS cuts again."""
    BLOCK_CACHE.clear()
    return node_blocks(graph, *args, **kwargs)


def test_the_same_input_again_gets_equal_blocks_and_notes_without_metis(graph, count_cuts):
    first_notes: list[str] = []
    first = node_blocks(graph, notes=first_notes)
    again_notes: list[str] = []
    again = node_blocks(graph, notes=again_notes)
    assert len(count_cuts) == 1 and (BLOCK_CACHE.hits, BLOCK_CACHE.misses) == (1, 1)
    assert np.array_equal(again.block, first.block) and again.block.dtype == np.int64
    assert dataclasses.replace(again, block=first.block) == first  # the other fields too
    assert again_notes == first_notes and any(n.startswith("metis: ") for n in again_notes)
    fresh = uncached(graph)  # what METIS cuts without the cache
    assert len(count_cuts) == 2 and np.array_equal(fresh.block, again.block)
    assert fresh.digest() == first.digest()


def test_a_graph_rebuilt_equal_hits_and_a_caller_writing_into_its_blocks_changes_no_other(
    graph, make_graph, count_cuts
):
    first = node_blocks(graph)
    kept = first.block.copy()
    first.block[:] = 0  # a caller writing into the array it got
    rebuilt = make_graph(num_nodes=500, num_blocks=6, avg_degree=8, seed=11)  # another object
    again = node_blocks(rebuilt)
    assert len(count_cuts) == 1 and np.array_equal(again.block, kept)
    again.block[:] = 1
    assert np.array_equal(node_blocks(graph).block, kept) and len(count_cuts) == 1


def _isolate_node_0(graph):
    """``graph`` with node 0's edges (both directions) dropped: the CSR differs, the training
    mask not."""
    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges), graph.indices, graph.indptr), shape=(n, n))
    keep = sp.diags((np.arange(n) != 0).astype(np.float64))
    a = (keep @ a @ keep).tocsr()
    a.eliminate_zeros()
    a.sort_indices()
    assert a.nnz < graph.num_edges
    return dataclasses.replace(
        graph, indptr=a.indptr.astype(np.int64), indices=a.indices.astype(np.int64)
    )


def _move_one_training_node(graph):
    """``graph`` with its first training node's mask bit moved to the first other node."""
    mask = graph.train_mask.copy()
    mask[np.flatnonzero(mask)[0]] = False
    mask[np.flatnonzero(~mask)[0]] = True
    return dataclasses.replace(graph, train_mask=mask)


@pytest.mark.parametrize(
    ("change", "kwargs"),
    [
        (_isolate_node_0, {}),
        (_move_one_training_node, {}),
        (None, {"seed": 2}),  # seeds 0 and 1 cut this graph alike
        (None, {"block_size": 5}),
        (None, {"metis": "pymetis"}),
    ],
)
def test_a_changed_input_misses_and_gets_its_own_blocks(graph, count_cuts, change, kwargs):
    other = graph if change is None else change(graph)
    reference = uncached(other, **kwargs).block  # its own blocks, cut with nothing kept
    BLOCK_CACHE.clear()
    base = node_blocks(graph)
    changed = node_blocks(other, **kwargs)
    assert len(count_cuts) == 3 and BLOCK_CACHE.misses == 2 and BLOCK_CACHE.hits == 0
    assert np.array_equal(changed.block, reference)
    assert np.array_equal(node_blocks(graph).block, base.block)  # the first one still kept
    assert BLOCK_CACHE.hits == 1 and len(count_cuts) == 3


def test_a_changed_input_gives_other_blocks_so_a_stale_hit_would_show(graph):
    """The negative control of the test above: each changed input's blocks differ from the
    base graph's, so a hit on the base graph's entry would have failed it."""
    base = node_blocks(graph).block
    for other, kwargs in [
        (_isolate_node_0(graph), {}),
        (_move_one_training_node(graph), {}),
        (graph, {"seed": 2}),
        (graph, {"block_size": 5}),
    ]:
        assert not np.array_equal(uncached(other, **kwargs).block, base)
    key = blocks_key(graph, 1, 0, "auto")
    assert key == blocks_key(dataclasses.replace(graph, name="renamed"), 1, 0, "auto")
    assert key != blocks_key(graph, 1, 0, "pymetis") != blocks_key(graph, 1, 0, "libmetis")
    as_int32 = dataclasses.replace(graph, indptr=graph.indptr.astype(np.int32))
    assert key != blocks_key(as_int32, 1, 0, "auto")  # dtypes are keyed (a miss, not a clash)


def test_the_least_recently_used_entry_goes_first():
    cache = BlockCache(size=2)
    entries = {
        k: CachedBlocks(np.full(3, i), 1, "libmetis", (f"n{i}",)) for i, k in enumerate("abc")
    }
    cache.put("a", entries["a"])
    cache.put("b", entries["b"])
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("c", entries["c"])
    assert len(cache) == 2 and cache.get("b") is None
    assert np.array_equal(cache.get("a").block, [0, 0, 0]) and cache.get("c").notes == ("n2",)
    assert (cache.hits, cache.misses) == (3, 1)
    entries["c"].block[:] = 7  # the cache holds its own copy
    assert np.array_equal(cache.get("c").block, [2, 2, 2])
    cache.clear()
    assert len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)
