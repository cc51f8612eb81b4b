"""``tree_bias`` (:mod:`fullgraph.models.tree_bias`): ``out + b`` inside a training step's block
tree. 61 rows in 13 blocks split among 1, 2 and 3 simulated ranks (contiguous and scattered
unions of whole blocks), each rank's bias partials in its own tree, the trees combined as
``Communicator.tree_sum_`` does: the gradient is the same bits for every split and equals the
column sums to float32 rounding; ``dOut`` goes on to ``out`` unchanged; the forward is
``out + b``'s bits; outside a tree (or on other rows than the part's) the bias gets autograd's
gradient. The control: one row sum per rank, added in rank order, changes with the split.
"""

from __future__ import annotations

import numpy as np
import torch

from fullgraph.distributed.tree_sum import BlockGradients, BlockLayout, collecting, combine
from fullgraph.models.tree_bias import tree_bias

SIZES = np.array([5, 2, 8, 3, 7, 4, 6, 2, 5, 8, 3, 4, 4])  # rows of each block, 61 in all
OUT = 6
SPLITS = {
    "one": [list(range(13))],
    "halves": [list(range(7)), list(range(7, 13))],
    "scattered-2": [[0, 2, 3, 8, 9, 12], [1, 4, 5, 6, 7, 10, 11]],
    "thirds": [list(range(4)), list(range(4, 9)), list(range(9, 13))],
    "scattered-3": [[0, 3, 6, 9, 12], [1, 4, 7, 10], [2, 5, 8, 11]],
}


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    n = int(SIZES.sum())
    out = torch.randn(n, OUT, generator=g)
    dy = torch.randn(n, OUT, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    return out, dy, torch.randn(OUT, generator=g)


def _rank_rows(blocks: list[int]) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    return np.concatenate([np.arange(starts[b], starts[b + 1]) for b in blocks])


def _split_gradient(split: str) -> torch.Tensor:
    """The tree's root of ``db`` over the ranks of ``split``."""
    out, dy, b0 = _data()
    bias = torch.nn.Parameter(b0.clone())
    pieces = []
    for blocks in SPLITS[split]:
        rows = _rank_rows(blocks)
        ptr = np.concatenate([[0], np.cumsum(SIZES[blocks])])
        layout = BlockLayout(len(SIZES), np.asarray(blocks), np.arange(len(rows)), ptr)
        tree = BlockGradients(layout)
        x = out[rows].clone().requires_grad_(True)
        with collecting(tree):
            y = tree_bias(x, bias)
        assert torch.equal(y, out[rows] + b0)
        y.backward(dy[rows])
        assert bias.grad is None and torch.equal(x.grad, dy[rows])
        pieces.append((layout.labels, list(tree.nodes([bias]))))
    return combine(len(SIZES), pieces)


def test_bias_gradient_is_the_same_bits_for_every_split() -> None:
    want = _split_gradient("one")
    for split in SPLITS:
        got = _split_gradient(split)
        assert torch.equal(got, want), (split, float((got - want).abs().max()))
    _, dy, _ = _data()
    torch.testing.assert_close(want.double(), dy.double().sum(0), rtol=1e-5, atol=1e-3)


def test_negative_control_one_sum_per_rank_differs() -> None:
    _, dy, _ = _data()
    sums = {}
    for split in ("one", "halves", "thirds", "scattered-3"):
        acc = torch.zeros(OUT)
        for blocks in SPLITS[split]:
            acc = acc + dy[_rank_rows(blocks)].sum(0)
        sums[split] = acc
    assert any(not torch.equal(sums["one"], s) for s in sums.values())


def test_no_tree_or_other_rows_is_autograd() -> None:
    out, dy, b0 = _data()
    bias = torch.nn.Parameter(b0.clone())
    tree_bias(out, bias).backward(dy)
    assert torch.equal(bias.grad, dy.sum(0))
    layout = BlockLayout(
        len(SIZES),
        np.arange(len(SIZES)),
        np.arange(len(out)),
        np.concatenate([[0], np.cumsum(SIZES)]),
    )
    bias.grad = None
    with collecting(BlockGradients(layout)) as tree:
        y = tree_bias(out[:10], bias)
    y.backward(dy[:10])
    assert torch.equal(bias.grad, dy[:10].sum(0)) and not tree.holds(bias)
