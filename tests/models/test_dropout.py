"""Counter-based dropout: masks keyed by global node ids, the torch path equal to numba's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fullgraph.models.dropout import dropout_keep_mask, hashed_dropout, keep_scale_torch, stream_key


def test_dropout_masks_depend_only_on_global_ids() -> None:
    gids = np.array([7, 2, 11, 5], dtype=np.int64)
    full = dropout_keep_mask(np.arange(12), 9, 0.5, 1, 3, 0)
    assert np.array_equal(dropout_keep_mask(gids, 9, 0.5, 1, 3, 0), full[gids])
    assert not np.array_equal(dropout_keep_mask(gids, 9, 0.5, 1, 4, 0), full[gids])
    big = dropout_keep_mask(np.arange(4000), 50, 0.25, 0, 1, 1)
    assert abs(big.mean() - 0.75) < 0.01
    h = torch.ones(4, 9, requires_grad=True)
    out = hashed_dropout(h, gids, 0.5, 1, 3, 0)
    assert torch.equal(out.detach(), torch.from_numpy(full[gids]).float() * 2.0)
    assert stream_key(1, 3, 0) != stream_key(1, 3, 1)


def test_torch_masks_equal_numba_masks() -> None:
    """The device (torch int64) path draws bit-identical masks to the CPU kernel."""
    gids = np.array([0, 3, 2**40 + 7, 123456789], dtype=np.int64)
    for width, p in ((9, 0.5), (256, 0.25), (3, 0.9)):
        ref = dropout_keep_mask(gids, width, p, 5, 6, 2)
        got = keep_scale_torch(torch.from_numpy(gids), width, p, stream_key(5, 6, 2), 1.0)
        assert np.array_equal(got.numpy() > 0, ref)


@pytest.mark.parametrize("width", [1, 11, 64])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_relu_dropout_equals_relu_then_dropout(width: int, inplace: bool) -> None:
    from fullgraph.models.dropout import ReluDropout

    gids = np.array([4, 9, 1, 30, 2], dtype=np.int64)
    x = torch.randn(5, width, dtype=torch.float32)
    x[0, 0] = -0.0
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref = hashed_dropout(torch.relu(a), gids, 0.5, 2, 7, 1)
    got = ReluDropout.apply(b * 1.0, gids, 0.5, 2, 7, 1, inplace)  # b * 1.0: a non-leaf input
    assert torch.equal(got, ref)
    w = torch.randn(5, width)
    (ref * w).sum().backward()
    (got * w).sum().backward()
    assert torch.equal(a.grad, b.grad)
