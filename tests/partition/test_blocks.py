"""Fixed node blocks and parts as runs of them: independent of P, whole, balanced, stored,
loaded, verified, and the same blocks for the one-process part."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fullgraph.errors import ConfigError, PartitionError
from fullgraph.partition import load_partition, partition_graph, verify_partitions
from fullgraph.partition.block_cache import BLOCK_CACHE
from fullgraph.partition.blocks import (
    block_assignment,
    block_loads,
    default_block_size,
    node_blocks,
    parts_from_blocks,
)
from fullgraph.partition.format import BLOCK_ARRAYS, PART_ARRAYS, sha256_file
from fullgraph.partition.whole import whole_graph_part


@pytest.fixture(scope="module")
def graph(make_graph):
    """A graph large enough for blocks of several nodes (block size 37: 33 blocks)."""
    return make_graph(num_nodes=1200, num_blocks=6, avg_degree=8, seed=11)


def stored_blocks(path, num_parts: int, num_nodes: int) -> np.ndarray:
    """The block of every node as the parts of ``path`` store it (-1: none)."""
    block = np.full(num_nodes, -1, dtype=np.int64)
    for r in range(num_parts):
        p = load_partition(path, r)
        inner = np.asarray(p.global_ids[: p.num_inner])
        block[inner[p.block_rows]] = np.repeat(p.block_ids, np.diff(p.block_ptr))
    return block


def test_default_block_size_rule():
    assert default_block_size(20) == 1
    assert default_block_size(100) == 3  # at least 32 blocks
    assert default_block_size(600) == 18  # the tests' graph: 34 blocks
    assert default_block_size(2708) == 64  # Cora: 43 blocks of 64 (not 271 of 10)
    assert default_block_size(16384) == 64  # from here N // 256
    assert default_block_size(20000) == 78
    assert default_block_size(34493) == 134  # Coauthor Physics: 258 blocks
    assert default_block_size(2_449_029) == 4096  # products: 598 blocks of at most 4096


def test_blocks_do_not_depend_on_p(graph, tmp_path):
    blocks = node_blocks(graph)
    assert blocks.block_size == default_block_size(graph.num_nodes) == 37
    assert blocks.sizes().min() >= 1 and blocks.num_blocks == blocks.block.max() + 1
    BLOCK_CACHE.clear()  # METIS cuts them again, not the cache
    assert np.array_equal(blocks.block, node_blocks(graph).block)  # deterministic
    assert BLOCK_CACHE.misses == 1
    for P in (1, 2, 3, 4, 8):
        BLOCK_CACHE.clear()  # cut at every P, not taken from the cut at the P before
        meta = partition_graph(graph, P, tmp_path / f"p{P}", seed=0)
        assert meta["num_blocks"] == blocks.num_blocks
        assert meta["block_sha256"] == blocks.digest()
        assert np.array_equal(stored_blocks(tmp_path / f"p{P}", P, graph.num_nodes), blocks.block)
        assert verify_partitions(tmp_path / f"p{P}", graph)["blocks_cut_again"]


@pytest.mark.parametrize("num_parts", [2, 3, 5, 8])
def test_parts_are_runs_of_whole_blocks_and_balanced(graph, num_parts):
    # blocks of 4 nodes (300): the runs' balance, not the default blocks' granularity (33)
    owner, blocks = block_assignment(graph, num_parts, seed=0, block_size=4)
    part_of = np.zeros(blocks.num_blocks, dtype=np.int64)
    part_of[blocks.block] = owner
    assert np.array_equal(part_of[blocks.block], owner)  # whole blocks
    assert (np.diff(part_of) >= 0).all() and set(part_of.tolist()) == set(range(num_parts))
    for name, load in block_loads(graph, blocks.block, blocks.num_blocks).items():
        totals = np.bincount(part_of, weights=load, minlength=num_parts)
        assert totals.max() / totals.mean() <= 1.1, (name, totals)


def test_parts_from_blocks_is_the_best_run_cut():
    loads = np.array([3, 1, 1, 1, 3, 1, 2], dtype=np.int64)  # mean part at P = 3: 4
    part = parts_from_blocks(loads, 3)
    assert (np.diff(part) >= 0).all() and set(part.tolist()) == {0, 1, 2}
    assert np.bincount(part, weights=loads).max() == 5  # no cut into 3 runs does better
    assert parts_from_blocks(np.ones(4), 4).tolist() == [0, 1, 2, 3]
    assert parts_from_blocks(np.array([10, 1, 1]), 3).tolist() == [0, 1, 2]  # none left empty
    with pytest.raises(ConfigError, match=r"cannot cut 4 blocks into 5 parts"):
        parts_from_blocks(np.ones(4), 5)


def test_more_parts_than_blocks_refused_in_one_line(graph, tmp_path):
    with pytest.raises(ConfigError, match=r"^cannot cut 12 blocks into 13 parts.*--block-size"):
        partition_graph(graph, 13, tmp_path / "p", block_size=100)
    assert not (tmp_path / "p").exists()


def test_inner_rows_block_contiguous_and_ascending(graph, tmp_path):
    partition_graph(graph, 3, tmp_path / "p", seed=0)
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    assert {f"part-{r}/{a}.npy" for r in range(3) for a in BLOCK_ARRAYS} <= set(meta["files"])
    seen: set[int] = set()
    for r in range(3):
        p = load_partition(tmp_path / "p", r)
        assert p.has_blocks and p.num_blocks == meta["num_blocks"]
        assert np.array_equal(p.block_rows, np.arange(p.num_inner))
        assert p.block_ptr[0] == 0 and p.block_ptr[-1] == p.num_inner
        ids = p.block_ids.tolist()
        assert ids == list(range(ids[0], ids[-1] + 1))  # one contiguous run
        assert not seen & set(ids)
        seen |= set(ids)
        gids = np.asarray(p.global_ids[: p.num_inner])
        for k in range(len(ids)):
            assert (np.diff(gids[p.block_ptr[k] : p.block_ptr[k + 1]]) > 0).all()
        # halo rows as before: grouped by owner, ascending global id within an owner
        halo = np.asarray(p.global_ids[p.num_inner :])
        for q in range(3):
            assert (np.diff(halo[p.halo_from(q)]) > 0).all()
    assert seen == set(range(meta["num_blocks"]))


def test_whole_graph_part_has_the_same_blocks(graph, tmp_path):
    whole = whole_graph_part(graph)
    partition_graph(graph, 4, tmp_path / "p", seed=0)
    stored = stored_blocks(tmp_path / "p", 4, graph.num_nodes)
    block = np.repeat(whole.block_ids, np.diff(whole.block_ptr))
    assert np.array_equal(stored[whole.global_ids[whole.block_rows]], block)
    assert whole.meta["block_sha256"] == load_partition(tmp_path / "p", 0).meta["block_sha256"]
    assert np.array_equal(whole.block_rows, np.arange(graph.num_nodes))  # block order
    for k in range(whole.num_blocks):  # ascending global id within a block
        gids = whole.global_ids[whole.block_ptr[k] : whole.block_ptr[k + 1]]
        assert (np.diff(gids) > 0).all()
    flat = whole_graph_part(graph, order="global")  # rows stay in place, block_rows orders them
    assert np.array_equal(flat.global_ids, np.arange(graph.num_nodes))
    assert np.array_equal(flat.block_rows, whole.global_ids)
    assert np.array_equal(flat.block_ptr, whole.block_ptr)


def test_kway_and_other_methods_have_no_blocks(graph, small_partitions, tmp_path):
    meta = partition_graph(graph, 2, tmp_path / "k", assign="kway")
    assert "num_blocks" not in meta and set(meta["files"]) == {
        f"part-{r}/{a}.npy" for r in range(2) for a in PART_ARRAYS
    }
    p = load_partition(tmp_path / "k", 1)
    assert not p.has_blocks
    assert (p.num_blocks, p.block_ids, p.block_rows, p.block_ptr) == (None,) * 4
    assert (np.diff(p.global_ids[: p.num_inner]) > 0).all()  # ascending global id, as before
    partition_graph(graph, 2, tmp_path / "r", method="random")
    assert not load_partition(tmp_path / "r", 0).has_blocks
    with pytest.raises(ConfigError, match="--assign blocks applies to --method metis"):
        partition_graph(graph, 2, tmp_path / "x", method="random", assign="blocks")
    with pytest.raises(ConfigError, match="--block-size applies to --assign blocks"):
        partition_graph(graph, 2, tmp_path / "x", assign="kway", block_size=8)


def test_old_partition_loads_without_blocks(small_partitions, tmp_path):
    """A partition written before blocks: its meta.json has no block keys nor block files."""
    old = tmp_path / "old"
    shutil.copytree(small_partitions[2], old)
    meta = json.loads((old / "meta.json").read_text())
    for key in ("num_blocks", "block_size", "block_seed", "block_metis", "block_sha256"):
        del meta[key]
    for part in meta["parts"]:
        del part["num_blocks"]
    for key in [k for k in meta["files"] if k.endswith(("block_ids.npy", "block_ptr.npy"))]:
        del meta["files"][key]
        (old / key).unlink()
    (old / "meta.json").write_text(json.dumps(meta))
    p = load_partition(old, 0)
    assert (p.num_blocks, p.block_ids, p.block_rows, p.block_ptr) == (None,) * 4
    assert verify_partitions(old)["num_blocks"] is None


def damage(path, rank: int, name: str, change) -> None:
    """Rewrite ``part-<rank>/<name>.npy`` as ``change`` returns it, its checksum updated."""
    key = f"part-{rank}/{name}.npy"
    array = np.load(path / key)
    changed = np.ascontiguousarray(change(array.copy()))
    np.save(path / key, changed)
    meta = json.loads((path / "meta.json").read_text())
    meta["files"][key].update(
        sha256=sha256_file(path / key),
        bytes=(path / key).stat().st_size,
        shape=list(changed.shape),
    )
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("rank", "name", "change", "message"),
    [
        (0, "block_ids", lambda a: a[::-1], r"block_ids\.npy is not a list of distinct blocks"),
        (0, "block_ptr", lambda a: np.where(np.arange(a.size) == 2, a[1], a), r"holds 0 rows"),
        (0, "block_ptr", lambda a: a[:-1], r"block_ptr\.npy does not run from 0"),
        (1, "block_ids", lambda a: a - 1, r"block \d+ is in part-0 too"),
    ],
)
def test_verify_catches_a_damaged_block_array(
    small_partitions, tmp_path, rank, name, change, message
):
    path = tmp_path / "p"
    shutil.copytree(small_partitions[2], path)
    damage(path, rank, name, change)
    with pytest.raises(PartitionError, match=message) as info:
        verify_partitions(path)
    assert "\n" not in str(info.value)


def test_verify_catches_blocks_moved_between_blocks(small_graph, tmp_path):
    """A block boundary moved by one row where the rows stay ascending: every local check
    passes, the digest of meta.json does not (blocks of 2 nodes: such boundaries are common)."""
    path = tmp_path / "p"
    partition_graph(small_graph, 4, path, seed=0, block_size=2)
    movable = []
    for rank in range(4):  # the first part with such a boundary
        p = load_partition(path, rank)
        gids, ptr = np.asarray(p.global_ids[: p.num_inner]), np.asarray(p.block_ptr)
        movable = [
            k
            for k in range(1, ptr.size - 1)
            if ptr[k + 1] - ptr[k] >= 2 and gids[ptr[k]] > gids[ptr[k] - 1]
        ]
        if movable:
            break
    assert movable, "no boundary to move"
    moved = ptr.copy()
    moved[movable[0]] += 1  # the first row of the next block joins the block before it
    damage(path, rank, "block_ptr", lambda a: moved)
    with pytest.raises(PartitionError, match=r"differ from the block_sha256 of meta\.json"):
        verify_partitions(path)


@pytest.mark.parametrize(("key", "value"), [("block_seed", 2), ("block_size", 3)])
def test_verify_cuts_the_blocks_again(small_graph, small_partitions, tmp_path, key, value):
    path = tmp_path / "p"
    shutil.copytree(small_partitions[4], path)
    summary = verify_partitions(path, small_graph)
    assert summary["blocks_cut_again"] and summary["num_blocks"] >= 32
    meta = json.loads((path / "meta.json").read_text())
    meta[key] = value  # the blocks recorded with another seed or size than they were cut with
    (path / "meta.json").write_text(json.dumps(meta))
    assert not verify_partitions(path)["blocks_cut_again"]  # the parts alone agree
    with pytest.raises(PartitionError, match=r"^the blocks cut again from sbm-test .* differ"):
        verify_partitions(path, small_graph)
