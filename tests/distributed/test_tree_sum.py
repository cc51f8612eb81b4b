"""The block tree: sums over fixed blocks whose bits do not depend on which rank holds which.

In-process checks push the same per-block partials on the stacks of 1, 2, 3 and 4 simulated
ranks (contiguous runs, uneven runs, scattered unions and every assignment of a few blocks) and
combine them as ``Communicator.tree_sum_`` does; the negative control sums the same partials in
rank order and gets other bits. The multi-rank checks run ``tree_worker.tree`` under ``mpirun``
on 2 and 3 ranks over ``mpi`` and ``gloo``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import tree_worker
from harness import run_task
from tree_worker import MODES, assign, block_partials, local_stack

from fullgraph.distributed.communicator import Communicator, ordered_sum
from fullgraph.distributed.tree_sum import (
    BlockGradients,
    BlockLayout,
    DyadicStack,
    combine,
    row_sum,
    stack_labels,
    tree_height,
)


def _root(partials: torch.Tensor, owned: list[np.ndarray]) -> torch.Tensor:
    """The root over ranks holding ``owned`` blocks (each rank's stack, then one combine)."""
    stacks = [local_stack(partials, blocks) for blocks in owned]
    return combine(int(partials.shape[0]), [(s.labels, s.values) for s in stacks])


def _rank_order(partials: torch.Tensor, owned: list[np.ndarray]) -> torch.Tensor:
    """Today's order: each rank's blocks left to right, then the ranks' sums in rank order."""
    sums = []
    for blocks in owned:
        acc = torch.zeros_like(partials[0])
        for b in blocks:
            acc = acc + partials[int(b)]
        sums.append(acc)
    return ordered_sum(torch.stack(sums))


def test_tree_height() -> None:
    assert [tree_height(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    with pytest.raises(ValueError, match="at least one block"):
        tree_height(0)


def test_a_rank_is_left_with_its_maximal_dyadic_intervals() -> None:
    assert stack_labels(13, np.arange(3, 11)) == [(0, 3), (2, 1), (1, 4), (0, 10)]
    assert stack_labels(13, np.arange(13)) == [(4, 0)]
    # block 4 of 5 has no right sibling in the graph: it is its parents, up to the root's child
    assert stack_labels(5, np.array([4])) == [(2, 1)]
    assert stack_labels(5, np.array([0, 2, 4])) == [(0, 0), (0, 2), (2, 1)]


def test_nodes_add_left_plus_right_and_skip_empty_siblings() -> None:
    v = [torch.tensor([1.0]), torch.tensor([2.0**-24]), torch.tensor([2.0**-24])]
    stack = DyadicStack(3)
    for b, value in enumerate(v):
        stack.push((0, b), value)
    # (b0 + b1) + b2, b2 never added to a zero: 1 + 2^-24 rounds to 1 twice
    assert stack.labels == [(2, 0)] and stack.root().item() == 1.0


@pytest.mark.parametrize("num_blocks", [1, 2, 5, 13, 32, 37])
def test_the_root_is_the_same_bits_for_every_assignment(num_blocks: int) -> None:
    partials = block_partials(num_blocks, 64)
    want = _root(partials, [np.arange(num_blocks)])
    for ranks in (2, 3, 4):
        for mode in MODES:
            owned = assign(num_blocks, ranks, mode)
            got = _root(partials, owned)
            assert torch.equal(got, want), (ranks, mode, float((got - want).abs().max()))


def test_every_assignment_of_six_blocks_to_three_ranks() -> None:
    partials = block_partials(6, 32, seed=3)
    want = _root(partials, [np.arange(6)])
    for owner in itertools.product(range(3), repeat=6):
        owned = [np.flatnonzero(np.asarray(owner) == r) for r in range(3)]
        assert torch.equal(_root(partials, owned), want), owner


def test_negative_control_rank_order_changes_the_bits() -> None:
    """The same partials summed in rank order differ between rank counts (so the checks above
    can fail), and differ from the tree's root."""
    partials = block_partials(13, 64)
    tree = _root(partials, [np.arange(13)])
    by_rank = {p: _rank_order(partials, assign(13, p, "runs")) for p in (1, 2, 3, 4)}
    assert not all(torch.equal(by_rank[1], by_rank[p]) for p in (2, 3, 4))
    assert not torch.equal(by_rank[1], tree)
    assert torch.allclose(by_rank[3], tree, rtol=1e-4, atol=1e-3)  # the same sum, rounded apart


def test_a_stack_refuses_disorder_overlap_and_gaps() -> None:
    stack = DyadicStack(8)
    stack.push((1, 1), torch.zeros(1))
    with pytest.raises(ValueError, match="out of order"):
        stack.push((0, 2), torch.zeros(1))
    with pytest.raises(ValueError, match="outside 8 blocks"):
        stack.push((0, 8), torch.zeros(1))
    with pytest.raises(ValueError, match="incomplete"):
        stack.root()
    with pytest.raises(ValueError, match="incomplete"):
        combine(4, [([(0, 0)], [torch.zeros(1)]), ([(0, 2), (0, 3)], [torch.zeros(1)] * 2)])


def test_one_process_communicator_is_the_same_tree() -> None:
    partials = block_partials(9, 16)
    stack = local_stack(partials, np.arange(9))
    got = Communicator().tree_sum_(torch.stack(stack.values), stack.labels, 9)
    assert torch.equal(got, _root(partials, assign(9, 3, "scattered")))


def test_layout_checks_its_arrays() -> None:
    layout = BlockLayout(10, np.array([2, 5]), np.arange(5), np.array([0, 3, 5]))
    assert layout.contiguous and layout.labels == [(0, 2), (0, 5)]
    assert layout.spans() == [slice(0, 3), slice(3, 5)]
    permuted = BlockLayout(10, np.array([2, 5]), np.array([1, 3, 4, 0, 2]), np.array([0, 3, 5]))
    assert not permuted.contiguous
    x = torch.arange(5.0)
    assert permuted.in_block_order(x).tolist() == [1.0, 3.0, 4.0, 0.0, 2.0]
    assert layout.in_block_order(x) is x
    stack = permuted.partials(lambda rows: rows.sum().reshape(1), x)
    assert stack.labels == [(0, 2), (0, 5)] and [v.item() for v in stack.values] == [8.0, 2.0]
    with pytest.raises(ValueError, match="block_ptr"):
        BlockLayout(10, np.array([2, 5]), np.arange(5), np.array([0, 5]))
    with pytest.raises(ValueError, match="ascend"):
        BlockLayout(10, np.array([5, 2]), np.arange(5), np.array([0, 3, 5]))
    with pytest.raises(ValueError, match="permutation"):
        BlockLayout(10, np.array([2, 5]), np.array([0, 0, 1, 2, 3]), np.array([0, 3, 5]))
    with pytest.raises(ValueError, match="at least one row"):
        BlockLayout(10, np.array([2, 5]), np.arange(5), np.array([0, 0, 5]))
    assert BlockLayout.of_part(object()) is None


@pytest.mark.parametrize("width", [1, 7, 128])
def test_row_sum_reads_rows_at_any_offset_as_a_fresh_copy(width: int) -> None:
    """A block's row sum is read where its rows lie (no copy): the same bits at every memory
    offset of the view as the sum of a fresh copy, what one process and P ranks each give."""
    rows = block_partials(23, width).squeeze(1) if width == 1 else block_partials(23, width)
    want = rows.clone().sum(0)
    for offset in range(33):
        buf = torch.empty(offset + rows.numel())
        view = buf[offset:].view(rows.shape)
        view.copy_(rows)
        assert torch.equal(row_sum(view), want), offset


def test_block_gradients_rows_are_parameters_then_loss() -> None:
    layout = BlockLayout(4, np.array([1, 2]), np.arange(4), np.array([0, 2, 4]))
    grads = BlockGradients(layout)
    w = torch.nn.Parameter(torch.zeros(2))
    assert grads.handles(w, 4) and not grads.handles(w, 3) and not grads.handles(w * 2, 4)
    x = torch.arange(8.0).view(4, 2)
    grads.add(w, lambda rows: rows.sum(0), x)
    grads.add(w, lambda rows: -rows.sum(0), x)
    grads.add_loss(torch.tensor([1.0, 2.0, 3.0, 4.0]), divisor=5)
    nodes = grads.nodes([w])
    assert grads.calls(w) == 2 and layout.labels == [(0, 1), (0, 2)]
    assert nodes.tolist() == [[2.0, 4.0, -2.0, -4.0, 3.0], [10.0, 12.0, -10.0, -12.0, 7.0]]
    assert grads.loss_divisor == 5.0


@pytest.mark.parametrize("ranks", [2, 3])
def test_tree_sum_over_real_ranks(ranks: int, tmp_path: Path) -> None:
    """``tree_sum_`` on mpi and gloo: the one-process root bit for bit on every rank, for
    contiguous, uneven and scattered assignments; bytes against ``allreduce_``'s."""
    result = run_task(
        tree_worker.tree,
        ranks=ranks,
        out=tmp_path / "tree.json",
        timeout=120,
        num_blocks=29,
        width=301,
        modes=list(MODES),
        transports=["mpi", "gloo"],
    )
    assert result["failures"] == []
    for key, per_rank in result["bytes"].items():
        for tree_bytes, flat_bytes in per_rank:
            assert flat_bytes <= tree_bytes <= 8 * flat_bytes, (key, tree_bytes, flat_bytes)
