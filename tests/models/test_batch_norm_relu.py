"""The fused BatchNorm + ReLU + dropout (CPU, float32) against the composed operations.

- on one process, forward, input and parameter gradients and running statistics equal
  ``ReluDropout(GraphBatchNorm(x))`` computed in float64 (to float32 rounding), with dropout on
  and off, with a large column mean (the shifted sums must not cancel) and after the running
  mean has moved;
- rows split over 2 and 3 in-process ranks give the one-process output and gradients;
- the composed path (float64) is what other dtypes take;
- under the block tree, a part's interval sums are the bits a ``DyadicStack`` pushed with its
  blocks' partials holds (the fused kernels' fast path), for any blocks a part may hold.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from test_norm import _ThreadComm

from fullgraph.distributed import Communicator
from fullgraph.distributed.tree_sum import BlockLayout, DyadicStack
from fullgraph.models.batch_norm_relu import BLOCK_ROWS, batch_norm_relu_dropout, interval_sums
from fullgraph.models.dropout import ReluDropout
from fullgraph.models.norm import GraphBatchNorm

N, C = 3 * BLOCK_ROWS + 77, 19  # several row blocks, a ragged last one


def _inputs(seed: int, offset: float) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=gen) * 2.0 + offset
    dy = torch.randn(N, C, generator=gen)
    gids = np.random.default_rng(seed).permutation(10 * N)[:N].astype(np.int64)
    return x, dy, gids


def _norm(seed: int) -> GraphBatchNorm:
    norm = GraphBatchNorm(C)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(C, generator=gen) + 0.5)
        norm.bias.copy_(torch.rand(C, generator=gen) - 0.5)
    return norm


def _step(norm, x, dy, gids, comm, p, fused: bool, epoch: int = 3):
    xa = x.clone().requires_grad_(True)
    if fused:
        y = batch_norm_relu_dropout(
            norm, xa, comm, global_ids=gids, p=p, seed=7, epoch=epoch, layer=1, training=True
        )
    else:
        y = ReluDropout.apply(norm(xa, comm), gids, p, 7, epoch, 1)
    (y * dy).sum().backward()
    return y.detach(), xa.grad


@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("offset", [0.0, 300.0])
def test_fused_equals_composed(p: float, offset: float) -> None:
    x, dy, gids = _inputs(0, offset)
    fused, plain = _norm(0), _norm(0).double()
    for epoch in (1, 2):  # the second step shifts the sums by a moved running mean
        yf, gf = _step(fused, x, dy, gids, Communicator(), p, True, epoch)
        yp, gp = _step(plain, x.double(), dy.double(), gids, Communicator(), p, False, epoch)
        yp, gp = yp.float(), gp.float()
        # float32 holds the mean to 2^-24 |mean|: the centred values carry that much.
        atol = 1e-5 + 2 * 2.0**-24 * offset
        torch.testing.assert_close(yf, yp, rtol=1e-5, atol=atol)
        # Where rounding puts a pre-activation on the other side of 0, the ReLU gradient there
        # differs by the whole gradient, and its column's batch terms by that over N: at the
        # large offset a few columns; they are left out of the gradient comparison.
        flipped = ((yf == 0) != (yp == 0)).any(dim=0)
        assert int(flipped.sum()) <= (3 if offset else 0)
        torch.testing.assert_close(gf[:, ~flipped], gp[:, ~flipped], rtol=1e-4, atol=atol)
        for name, got in fused.state_dict().items():
            want = plain.state_dict()[name].to(got.dtype)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
        for got, want in (
            (fused.weight.grad, plain.weight.grad),
            (fused.bias.grad, plain.bias.grad),
        ):
            torch.testing.assert_close(got[~flipped], want.float()[~flipped], rtol=1e-5, atol=1e-3)
        assert int(fused.num_batches_tracked) == epoch
        fused.zero_grad()
        plain.zero_grad()
    assert (yf == 0).float().mean() > (0.5 + p) / 2 - 0.1  # ReLU and dropout both bite


@pytest.mark.parametrize("ranks", [2, 3])
def test_fused_over_split_rows_equals_one_process(ranks: int) -> None:
    x, dy, gids = _inputs(1, 5.0)
    one = _norm(1)
    y1, g1 = _step(one, x, dy, gids, Communicator(), 0.3, True)
    cuts = np.linspace(0, N, ranks + 1).astype(int)
    cuts[1] = BLOCK_ROWS + 5  # parts that do not align with the row blocks
    shared = {"box": {}, "barrier": threading.Barrier(ranks)}
    norms = [_norm(1) for _ in range(ranks)]
    outs: dict[int, tuple] = {}

    def rank(r: int) -> None:
        sl = slice(cuts[r], cuts[r + 1])
        comm = _ThreadComm(r, ranks, shared)
        outs[r] = _step(norms[r], x[sl], dy[sl], gids[sl], comm, 0.3, True)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    torch.testing.assert_close(torch.cat([outs[r][0] for r in range(ranks)]), y1)
    torch.testing.assert_close(torch.cat([outs[r][1] for r in range(ranks)]), g1)
    w_grad = sum(n.weight.grad for n in norms)
    torch.testing.assert_close(w_grad, one.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(norms[-1].running_var, one.running_var)


def test_float64_takes_the_composed_path() -> None:
    x, dy, gids = _inputs(2, 0.0)
    a, b = _norm(2).double(), _norm(2).double()
    ya, ga = _step(a, x.double(), dy.double(), gids, Communicator(), 0.5, True)
    yb, gb = _step(b, x.double(), dy.double(), gids, Communicator(), 0.5, False)
    assert torch.equal(ya, yb) and torch.equal(ga, gb)


def test_output_buffer_is_reused_only_once_released() -> None:
    """Step k's output buffer serves step k + 1 only when nothing holds it any more; reused or
    fresh, the values and gradients are the same bits."""
    x, dy, gids = _inputs(0, 0.0)
    reuse, fresh = _norm(0), _norm(0)
    held = []  # keeps every output of ``fresh``: its buffers can never be reused
    pointers = []
    for epoch in (1, 2, 3):
        ya, ga = _step(reuse, x, dy, gids, Communicator(), 0.5, True, epoch)
        yb, gb = _step(fresh, x, dy, gids, Communicator(), 0.5, True, epoch)
        assert torch.equal(ya, yb) and torch.equal(ga, gb)
        assert torch.equal(reuse.weight.grad, fresh.weight.grad)
        pointers.append((ya.data_ptr(), yb.data_ptr()))
        held.append(yb)
        del ya  # the step's graph is gone too: ``reuse`` may take this buffer again
        reuse.zero_grad()
        fresh.zero_grad()
    assert pointers[0][0] == pointers[1][0] == pointers[2][0]
    assert len({b for _, b in pointers}) == 3
    assert torch.equal(held[0], _step(_norm(0), x, dy, gids, Communicator(), 0.5, True, 1)[0])


def test_evaluation_is_one_pass_into_the_kept_buffer() -> None:
    x, dy, gids = _inputs(1, 3.0)
    norm = _norm(1)
    for epoch in (1, 2):  # running statistics away from their start
        y, _ = _step(norm, x, dy, gids, Communicator(), 0.5, True, epoch)
    del y
    kept = norm._fused_out.data_ptr()
    norm.eval()
    with torch.no_grad():
        got = batch_norm_relu_dropout(
            norm,
            x,
            Communicator(),
            global_ids=gids,
            p=0.5,
            seed=7,
            epoch=3,
            layer=1,
            training=False,
        )
        want = torch.relu(norm.double()(x.double(), None)).float()
    assert got.data_ptr() == kept  # no new activation-sized buffer
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got == 0).float().mean() < 0.75  # ReLU only: nothing dropped in evaluation


@pytest.mark.parametrize("num_blocks", [1, 2, 7, 16, 37])
def test_interval_sums_are_the_stacks(num_blocks: int) -> None:
    rng = np.random.default_rng(num_blocks)
    for _ in range(20):
        ids = np.flatnonzero(rng.random(num_blocks) < rng.uniform(0.2, 1.0))
        if not len(ids):
            ids = np.array([int(rng.integers(num_blocks))])
        layout = BlockLayout(num_blocks, ids, np.arange(len(ids)), np.arange(len(ids) + 1))
        partials = rng.standard_normal((len(ids), 5)) * 10.0 ** rng.integers(-8, 8, (len(ids), 5))
        stack = DyadicStack(num_blocks)
        for b, v in zip(ids.tolist(), partials, strict=True):
            stack.push((0, b), torch.from_numpy(v.copy()))
        got = torch.from_numpy(interval_sums(layout, partials))
        assert stack.labels == layout.labels
        assert torch.equal(got, torch.stack(stack.values)), (ids, layout.labels)
