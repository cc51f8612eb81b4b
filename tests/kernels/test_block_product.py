"""``block_product``: a block's ``dY_b^T x_b`` with the same bits at 1, 2 and 8 threads for
every output width (torch's float32 ``mm`` is not, for 5-11 output rows), and the product to
rounding."""

from __future__ import annotations

import pytest
import torch
from mp_utils import threads_restored

from fullgraph.kernels.block_product import block_product


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_same_bits_at_any_thread_count(dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    with threads_restored():
        for m in (1, 5, 7, 11, 12, 33):
            for k, n in ((1, 16), (18, 64), (117, 7), (300, 256)):
                a = torch.randn(k, m, generator=gen).to(dtype)
                b = torch.randn(k, n, generator=gen).to(dtype)
                torch.set_num_threads(1)
                want = block_product(a, b)
                for threads in (2, 8):
                    torch.set_num_threads(threads)
                    assert torch.equal(block_product(a, b), want), (m, k, n, threads)
                ref = a.double().t() @ b.double()
                tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
                torch.testing.assert_close(want.double(), ref, rtol=tol, atol=tol * k**0.5)
