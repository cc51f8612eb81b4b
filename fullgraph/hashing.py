"""Counter-based hashes: every random draw of fullgraph is a pure function of its coordinates.

Dropout masks, neighbour samples and the stochastic rounding of compressed halos hash a key
derived from ``(seed, epoch, layer, ...)`` with a counter (a global node id, an edge, a column),
so P ranks and one process draw the same numbers, on any machine and thread count. Two hashes:

- **splitmix64** (Steele, Lea, Flood 2014): the 64-bit finaliser :func:`mix64` of
  ``x + GOLDEN``; :func:`splitmix64` on Python integers, :func:`splitmix64_u64` and
  :func:`mix64_u64` compiled by numba, :func:`splitmix64_torch` on int64 tensors (with
  :func:`as_int64` for the keys it is combined with), and :func:`key_chain` / :func:`fold_key`
  to derive keys;
- **lowbias32** (Chris Wellons' hash-prospector): a 32-bit integer hash, :func:`lowbias32` on
  int64 tensors and :func:`lowbias32_u64` compiled by numba (the Triton kernels use
  :data:`LOWBIAS_C1`, :data:`LOWBIAS_C2` in their own jitted copy).

Each form is checked against the others and against published values in
``tests/test_hashing.py``.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
#: splitmix64's increment (2^64 / golden ratio) and finaliser multipliers.
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
#: lowbias32's multipliers.
LOWBIAS_C1 = 0x7FEB352D
LOWBIAS_C2 = 0x846CA68B


def mix64(z: int) -> int:
    """splitmix64's finaliser of a Python integer (taken modulo 2**64)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def splitmix64(x: int) -> int:
    """One splitmix64 output for state ``x``: ``mix64(x + GOLDEN)``."""
    return mix64((x & MASK64) + GOLDEN)


def key_chain(seed: int, *coords: int) -> int:
    """A 64-bit key of ``(seed, *coords)``: ``h = splitmix64(seed)``, then
    ``h = splitmix64(h ^ c)`` for every coordinate (dropout streams, rounding seeds)."""
    h = splitmix64(seed)
    for c in coords:
        h = splitmix64(h ^ (int(c) & MASK64))
    return h


def fold_key(*parts: int) -> int:
    """A 64-bit key of ``parts``: ``z = GOLDEN``, then ``z = splitmix64(z + p)`` for every part
    (the neighbour sampler's batch keys)."""
    z = GOLDEN
    for p in parts:
        z = splitmix64(z + (int(p) & MASK64))
    return z


_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_UGOLDEN, _UMIX1, _UMIX2 = np.uint64(GOLDEN), np.uint64(MIX1), np.uint64(MIX2)


@numba.njit(inline="always", cache=True, nogil=True)
def mix64_u64(z):  # pragma: no cover - compiled by numba
    """:func:`mix64` of a ``uint64`` (wrapping arithmetic), compiled."""
    z = (z ^ (z >> _U30)) * _UMIX1
    z = (z ^ (z >> _U27)) * _UMIX2
    return z ^ (z >> _U31)


@numba.njit(inline="always", cache=True, nogil=True)
def splitmix64_u64(x):  # pragma: no cover - compiled by numba
    """:func:`splitmix64` of a ``uint64``, compiled."""
    return mix64_u64(x + _UGOLDEN)


def as_int64(c: int) -> int:
    """The int64 bit pattern of a 64-bit unsigned integer (to combine with int64 tensors)."""
    c &= MASK64
    return c - (1 << 64) if c >= (1 << 63) else c


def _srl(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def splitmix64_torch(x: torch.Tensor) -> torch.Tensor:
    """:func:`splitmix64` of int64 bit patterns, on any device.

    int64 arithmetic wraps like uint64 (two's complement), so the bits equal
    :func:`splitmix64_u64`'s.
    """
    z = x + as_int64(GOLDEN)
    z = (z ^ _srl(z, 30)) * as_int64(MIX1)
    z = (z ^ _srl(z, 27)) * as_int64(MIX2)
    return z ^ _srl(z, 31)


_M32 = np.uint64(MASK32)
_S15, _S16 = np.uint64(15), np.uint64(16)
_UC1, _UC2 = np.uint64(LOWBIAS_C1), np.uint64(LOWBIAS_C2)


@numba.njit(inline="always", cache=True)
def lowbias32_u64(x):  # pragma: no cover - compiled by numba
    """lowbias32 of a ``uint64`` holding a value in ``[0, 2^32)``, compiled."""
    x = x ^ (x >> _S16)
    x = (x * _UC1) & _M32
    x = x ^ (x >> _S15)
    x = (x * _UC2) & _M32
    return x ^ (x >> _S16)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for int64 ``x`` in ``[0, 2^32)``, without int64 overflow."""
    lo = (x & 0xFFFF) * c
    hi = (((x >> 16) * c) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on an int64 tensor holding values in ``[0, 2^32)``."""
    x = x ^ (x >> 16)
    x = _mul32(x, LOWBIAS_C1)
    x = x ^ (x >> 15)
    x = _mul32(x, LOWBIAS_C2)
    return x ^ (x >> 16)
