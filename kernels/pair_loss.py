"""Binary cross-entropy with logits whose every element is a fixed function of that element.

torch's elementwise kernels compute ``exp`` / ``log1p`` with SIMD code on the bulk of a tensor
and scalar code on its tail, whose results can differ in the last bit: an element's loss (and
its gradient, a sigmoid) then depends on where in the tensor it lies, i.e. on how many pairs a
rank holds. :func:`pair_bce` computes each element with one scalar loop (numba, ``math``
functions in float64, rounded once to the scores' dtype): the same bits wherever the element
lies. The reference is ``F.binary_cross_entropy_with_logits(..., reduction="none")``
(``tests/kernels/test_pair_loss.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import torch
import torch.nn.functional as F


@numba.njit(cache=True, nogil=True)
def _bce(s, y, w, out):  # pragma: no cover - compiled by numba
    """out[i] = w_i (max(s_i, 0) - s_i y_i + log1p(exp(-|s_i|))), in float64 then rounded."""
    for i in range(s.shape[0]):
        x = float(s[i])
        out[i] = w[i] * (max(x, 0.0) - x * float(y[i]) + math.log1p(math.exp(-abs(x))))


@numba.njit(cache=True, nogil=True)
def _bce_grad(s, y, w, g, out):  # pragma: no cover - compiled by numba
    """out[i] = g_i w_i (sigmoid(s_i) - y_i), in float64 then rounded."""
    for i in range(s.shape[0]):
        x = float(s[i])
        if x >= 0.0:
            p = 1.0 / (1.0 + math.exp(-x))
        else:
            e = math.exp(x)
            p = e / (1.0 + e)
        out[i] = float(g[i]) * float(w[i]) * (p - float(y[i]))


class PairBCEFunction(torch.autograd.Function):
    """:func:`pair_bce` with its gradient with respect to the scores."""

    @staticmethod
    def forward(ctx: Any, s: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Per-element losses."""
        ctx.save_for_backward(s, y, w)
        out = torch.empty_like(s)
        _bce(*(t.detach().contiguous().numpy() for t in (s, y, w)), out.numpy())
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        """``g w (sigmoid(s) - y)`` per element."""
        s, y, w = ctx.saved_tensors
        out = torch.empty_like(s)
        arrays = (t.detach().contiguous().numpy() for t in (s, y, w, g.to(s.dtype)))
        _bce_grad(*arrays, out.numpy())
        return out, None, None


def pair_bce(s: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-element binary cross-entropy of logits ``s`` against labels ``y`` weighted by ``w``
    (all [m], float32 or float64), each element the same bits wherever it lies (CPU); on other
    devices torch's own (whose elements a GPU kernel computes alike).

    Returns:
        [m], ``s``'s dtype.
    """
    if s.device.type != "cpu" or s.dtype not in (torch.float32, torch.float64):
        return F.binary_cross_entropy_with_logits(s, y.to(s.dtype), weight=w, reduction="none")
    return PairBCEFunction.apply(s, y.to(s.dtype), w.to(s.dtype))


__all__ = ["pair_bce"]
