"""``pair_bce`` against torch's binary cross-entropy with logits, and its element invariance:
an element's loss and gradient are the same bits wherever it lies in the tensor."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fullgraph.kernels.pair_loss import pair_bce


def _data(n: int = 4099, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, generator=g) * 6
    y = (torch.rand(n, generator=g) > 0.5).float()
    w = torch.rand(n, generator=g)
    return s, y, w


def test_matches_torch() -> None:
    s, y, w = _data()
    s64 = s.double().requires_grad_()
    ref = F.binary_cross_entropy_with_logits(s64, y.double(), weight=w.double(), reduction="none")
    ref.sum().backward()
    got_s = s.clone().requires_grad_()
    got = pair_bce(got_s, y, w)
    got.sum().backward()
    assert torch.allclose(got.double(), ref.detach(), rtol=1e-6, atol=1e-7)
    assert torch.allclose(got_s.grad.double(), s64.grad, rtol=1e-6, atol=1e-8)
    assert (w * 0 == pair_bce(s, y, w * 0)).all()  # weight 0: loss 0


def test_every_element_alike_wherever_it_lies() -> None:
    s, y, w = _data()
    full_s = s.clone().requires_grad_()
    full = pair_bce(full_s, y, w)
    full.sum().backward()
    for lo, hi in ((0, 1), (3, 20), (1001, 1010), (17, 4099)):
        part_s = s[lo:hi].clone().requires_grad_()
        part = pair_bce(part_s, y[lo:hi], w[lo:hi])
        part.sum().backward()
        assert torch.equal(part, full[lo:hi].detach())
        assert torch.equal(part_s.grad, full_s.grad[lo:hi])
