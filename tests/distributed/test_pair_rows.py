"""``PairRows`` in one process: the pairs' rows and the gradient of every node (the sum of its
pairs' terms in ascending key) against plain autograd, and the same bits whatever order the
pairs come in (the order is the keys', not the positions'). The P-rank contract is checked
end to end by ``tests/training/test_link_trainer.py``."""

from __future__ import annotations

import numpy as np
import torch

from fullgraph.distributed.communicator import Communicator
from fullgraph.distributed.pair_rows import NodeOwners, PairRows


def _grad(h0: torch.Tensor, pairs: np.ndarray, keys: np.ndarray, c: torch.Tensor) -> torch.Tensor:
    comm = Communicator()
    n = h0.shape[0]
    owners = NodeOwners(comm, np.arange(n), n)
    plan = PairRows.build(comm, owners, pairs[:, 0], pairs[:, 1], keys, n)
    h = h0.clone().requires_grad_()
    hu, hv = plan.rows(h)
    ((hu * hv).sum(1) * c).sum().backward()
    return h.grad


def test_gradient_matches_autograd_and_ignores_pair_order() -> None:
    rng = np.random.default_rng(0)
    n, m = 50, 400
    h0 = torch.randn(n, 8, generator=torch.Generator().manual_seed(1))
    pairs = rng.integers(0, n, size=(m, 2))
    keys = rng.permutation(10 * m)[:m]
    c = torch.randn(m, generator=torch.Generator().manual_seed(2))
    got = _grad(h0, pairs, keys, c)
    h = h0.clone().requires_grad_()
    ((h[pairs[:, 0]] * h[pairs[:, 1]]).sum(1) * c).sum().backward()
    assert torch.allclose(got, h.grad, rtol=1e-5, atol=1e-6)
    perm = rng.permutation(m)
    again = _grad(h0, pairs[perm], keys[perm], c[perm])
    assert torch.equal(again, got)


def test_owners_refuse_an_unowned_node() -> None:
    import pytest

    with pytest.raises(ValueError, match="owned by no rank"):
        NodeOwners(Communicator(), np.array([0, 2]), 3)
