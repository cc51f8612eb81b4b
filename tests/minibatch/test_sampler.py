"""Neighbour sampler: real neighbours, fanout bounds, no duplicates, seeds first, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fullgraph.errors import ConfigError
from fullgraph.minibatch.sampler import NeighborSampler, global_batches, rank_share


def random_csr(num_nodes: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric graph without self loops whose degrees range from 0 to ~60."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 30, size=num_nodes)
    rows = np.repeat(np.arange(num_nodes), deg)
    cols = rng.integers(0, num_nodes, size=rows.size)
    a = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(num_nodes, num_nodes)).tocsr()
    a = (a + a.T).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    a.sort_indices()
    return a.indptr.astype(np.int64), a.indices.astype(np.int64)


@pytest.fixture(scope="module")
def graph() -> tuple[np.ndarray, np.ndarray]:
    return random_csr()


@pytest.mark.parametrize("fanouts", [[5], [15, 10, 5], [3, 3], [-1, 2]])
def test_sampled_neighbours_are_real_bounded_and_distinct(graph, fanouts) -> None:
    indptr, indices = graph
    sampler = NeighborSampler(indptr, indices, fanouts, seed=3)
    seeds = np.random.default_rng(1).choice(indptr.size - 1, size=40, replace=False)
    batch = sampler.sample(seeds, epoch=2, batch=7)
    deg = np.diff(indptr)
    # blocks[-1] is hop 1 (fanouts[0]); blocks[0] the outermost hop.
    for block, fanout in zip(batch.blocks[::-1], sampler.fanouts, strict=True):
        assert block.indptr.shape == (block.num_dst + 1,)
        assert block.indices.size == 0 or block.indices.max() < block.num_src
        for i in range(block.num_dst):
            v = batch.nodes[i]
            picked = batch.nodes[block.indices[block.indptr[i] : block.indptr[i + 1]]]
            true_nbrs = indices[indptr[v] : indptr[v + 1]]
            assert np.isin(picked, true_nbrs).all(), f"node {v}: sampled a non-neighbour"
            assert picked.size == min(deg[v], fanout)
            assert np.unique(picked).size == picked.size, f"node {v}: duplicate neighbours"
            if deg[v] <= fanout:
                assert set(picked.tolist()) == set(true_nbrs.tolist())


def test_seeds_first_and_blocks_chain(graph) -> None:
    indptr, indices = graph
    sampler = NeighborSampler(indptr, indices, [4, 3, 2], seed=0)
    seeds = np.array([17, 3, 250, 42], dtype=np.int64)
    batch = sampler.sample(seeds)
    np.testing.assert_array_equal(batch.nodes[:4], seeds)
    np.testing.assert_array_equal(batch.seeds, seeds)
    assert np.unique(batch.nodes).size == batch.nodes.size
    assert batch.blocks[-1].num_dst == seeds.size
    assert batch.blocks[0].num_src == batch.nodes.size
    for inner, outer in zip(batch.blocks[1:], batch.blocks[:-1], strict=True):
        assert outer.num_dst == inner.num_src  # one layer's sources are the next one's rows
        assert outer.num_dst <= outer.num_src


def test_same_seed_same_batches_other_seed_differs(graph) -> None:
    indptr, indices = graph
    seeds = np.arange(0, 300, 7, dtype=np.int64)

    def flat(s: int, epoch: int) -> list[np.ndarray]:
        b = NeighborSampler(indptr, indices, [5, 5], seed=s).sample(seeds, epoch=epoch, batch=1)
        return [b.nodes] + [a for blk in b.blocks for a in (blk.indptr, blk.indices)]

    for a, b in zip(flat(11, 0), flat(11, 0), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        a.shape != b.shape or not np.array_equal(a, b)
        for a, b in zip(flat(11, 0), flat(12, 0), strict=True)
    )
    assert any(
        a.shape != b.shape or not np.array_equal(a, b)
        for a, b in zip(flat(11, 0), flat(11, 1), strict=True)
    )


def test_sampling_is_uniform() -> None:
    # One hub of in-degree 12 sampled with fanout 4 in 3000 batches: each neighbour ~1/3 of the
    # time. Floyd's algorithm done wrong shows up as a strong bias here.
    n = 13
    indptr = np.array([0, 12] + [12] * (n - 1), dtype=np.int64)
    indices = np.arange(1, n, dtype=np.int64)
    sampler = NeighborSampler(indptr, indices, [4], seed=5)
    counts = np.zeros(n, dtype=np.int64)
    trials = 3000
    for b in range(trials):
        batch = sampler.sample(np.array([0]), epoch=0, batch=b)
        counts[batch.nodes[batch.blocks[0].indices]] += 1
    freq = counts[1:] / trials
    assert np.all(np.abs(freq - 4 / 12) < 0.04), freq


def test_isolated_seed_gives_empty_rows() -> None:
    indptr = np.array([0, 0, 1, 2], dtype=np.int64)  # node 0 isolated; 1 <- 2, 2 <- 1
    indices = np.array([2, 1], dtype=np.int64)
    batch = NeighborSampler(indptr, indices, [3, 3]).sample(np.array([0, 1]))
    hop1 = batch.blocks[-1]
    np.testing.assert_array_equal(hop1.indptr, [0, 0, 1])
    np.testing.assert_array_equal(batch.nodes, [0, 1, 2])
    assert batch.blocks[0].num_dst == 3 and batch.blocks[0].num_edges == 2


def test_batches_cover_the_training_nodes_and_shares_rebuild_them() -> None:
    train = np.arange(100, 203, dtype=np.int64)
    batches = global_batches(train, 16, seed=4, epoch=1)
    assert [b.size for b in batches] == [16] * 6 + [7]
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)), train)
    for glob in batches:
        shares = [rank_share(glob, r, 3) for r in range(3)]
        np.testing.assert_array_equal(np.concatenate(shares), glob)
    np.testing.assert_array_equal(
        np.concatenate(global_batches(train, 16, 4, 1)), np.concatenate(batches)
    )
    other = global_batches(train, 16, seed=4, epoch=2)
    assert not np.array_equal(np.concatenate(other), np.concatenate(batches))
    assert rank_share(np.array([5], dtype=np.int64), 1, 2).size == 0


def test_bad_input_is_rejected(graph) -> None:
    indptr, indices = graph
    with pytest.raises(ConfigError, match="fanout 0"):
        NeighborSampler(indptr, indices, [5, 0])
    with pytest.raises(ConfigError, match="at least one hop"):
        NeighborSampler(indptr, indices, [])
    with pytest.raises(ConfigError, match="CSR mismatch"):
        NeighborSampler(indptr, indices[:-1], [5])
    sampler = NeighborSampler(indptr, indices, [5])
    with pytest.raises(ConfigError, match="seed node 300 out of range"):
        sampler.sample(np.array([1, 300]))
    with pytest.raises(ConfigError, match="repeated"):
        sampler.sample(np.array([4, 4]))
    with pytest.raises(ConfigError, match="batch size"):
        global_batches(np.arange(5), 0, 0, 0)
