"""The trainer with and without the part's fixed node blocks, one process.

With blocks the weight and bias gradients and the loss go through the block tree
(:mod:`fullgraph.distributed.tree_sum`) and equal the sums in one piece to float rounding, for
kinds whose parameters all go through it (GCN, SAGE), partly (GIN: ``W1`` also reaches autograd
through the root ``(1 + eps) W1``, ``eps`` only there) and not at all (GAT, BatchNorm's
parameters); a part without blocks (a partition written before them) trains as before, rank 0
printing one line that says so.

Enters through :mod:`fullgraph.training.trainer`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mp_utils import one_thread

from fullgraph.distributed.communicator import Communicator
from fullgraph.partition import whole_graph_part
from fullgraph.training import RunOptions, TrainConfig, Trainer
from fullgraph.training.trainer import NO_BLOCKS_NOTE

CASES = {
    "gcn": {},
    "sage": {},
    "gin": {},
    "gat": {"hidden": 6, "heads": 2},
    "gcn_batchnorm": {"model": "gcn", "norm": "batch"},
    "sage_residual": {"model": "sage", "residual": True, "hidden": 10},
}


def _without_blocks(part):
    return dataclasses.replace(
        part, num_blocks=None, block_ids=None, block_rows=None, block_ptr=None
    )


def _step(part, name: str, quiet: bool = True) -> tuple[Trainer, float, torch.Tensor]:
    fields = {"model": name, "layers": 2, "hidden": 16, "dropout": 0.5, "seed": 3, "epochs": 2}
    cfg = TrainConfig(**{**fields, **CASES[name]})
    tr = Trainer(part, Communicator(), cfg, RunOptions(quiet=quiet))
    loss = tr.train_step(1).loss
    grads = torch.cat([p.grad.reshape(-1) for p in tr.model.parameters()])
    return tr, loss, grads


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_tree_gives_the_sums_to_float_rounding(small_graph, name: str) -> None:
    part = whole_graph_part(small_graph)
    assert part.num_blocks is not None and part.num_blocks > 1
    with one_thread():
        tree, loss, grads = _step(part, name)
        plain, loss0, grads0 = _step(_without_blocks(part), name)
    assert tree.ctx.blocks is not None and plain.ctx.blocks is None
    assert loss == pytest.approx(loss0, rel=1e-6)
    torch.testing.assert_close(grads, grads0, rtol=1e-5, atol=1e-6)


def test_a_part_without_blocks_says_so_once(small_graph, capsys) -> None:
    part = whole_graph_part(small_graph)
    with one_thread():
        _step(_without_blocks(part), "gcn", quiet=False)
        assert capsys.readouterr().out.count(NO_BLOCKS_NOTE) == 1
        _step(part, "gcn", quiet=False)
        assert NO_BLOCKS_NOTE not in capsys.readouterr().out
    assert "fullgraph partition" in NO_BLOCKS_NOTE and "\n" not in NO_BLOCKS_NOTE


def test_sums_rank_order_trains_without_the_tree(small_graph, capsys) -> None:
    """``--sums rank-order`` on a part with blocks: the trainer drops the tree (the bits of a
    part without blocks), says nothing, and ``tree`` (the default) keeps it."""
    part = whole_graph_part(small_graph)
    fields = {"model": "sage", "layers": 2, "hidden": 16, "dropout": 0.5, "seed": 3}
    with one_thread():
        tr = Trainer(part, Communicator(), TrainConfig(**fields, sums="rank-order"), RunOptions())
        assert tr.ctx.blocks is None and NO_BLOCKS_NOTE not in capsys.readouterr().out
        got = torch.cat(
            [
                torch.tensor([tr.train_step(1).loss]),
                *(p.detach().reshape(-1) for p in tr.model.parameters()),
            ]
        )
        plain = Trainer(
            _without_blocks(part), Communicator(), TrainConfig(**fields), RunOptions(quiet=True)
        )
        want = torch.cat(
            [
                torch.tensor([plain.train_step(1).loss]),
                *(p.detach().reshape(-1) for p in plain.model.parameters()),
            ]
        )
        assert torch.equal(got, want)
        assert (
            Trainer(part, Communicator(), TrainConfig(**fields), RunOptions(quiet=True)).ctx.blocks
            is not None
        )
    with pytest.raises(Exception, match="sums"):
        TrainConfig(**fields, sums="random")
