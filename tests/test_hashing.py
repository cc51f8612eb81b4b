"""The counter hashes of :mod:`fullgraph.hashing`: published values, and every form equal.

splitmix64 outputs are Vigna's reference generator seeded with 0 (``state += GOLDEN``, then the
finaliser); lowbias32 values follow Wellons' definition written out here in plain Python.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from fullgraph import hashing


def test_splitmix64_known_values() -> None:
    state, outs = 0, []
    for _ in range(3):
        outs.append(hashing.splitmix64(state))
        state += 0x9E3779B97F4A7C15
    assert outs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def _lowbias32_reference(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@numba.njit
def _splitmix64_many(xs):  # pragma: no cover - compiled
    out = np.empty_like(xs)
    for i in range(xs.shape[0]):
        out[i] = hashing.splitmix64_u64(xs[i])
    return out


@numba.njit
def _lowbias32_many(xs):  # pragma: no cover - compiled
    out = np.empty_like(xs)
    for i in range(xs.shape[0]):
        out[i] = hashing.lowbias32_u64(xs[i])
    return out


VALUES = [0, 1, 2, 12345, 2**31 - 1, 2**32 - 1, 2**40 + 7, 2**63, 2**64 - 1]


def test_compiled_splitmix64_equals_python() -> None:
    got = _splitmix64_many(np.array(VALUES, dtype=np.uint64))
    assert [int(v) for v in got] == [hashing.splitmix64(v) for v in VALUES]


def test_torch_splitmix64_equals_numba_and_python() -> None:
    """The int64-tensor form gives the bits of the compiled and the Python-integer forms."""
    xs = np.array(VALUES, dtype=np.uint64)
    got = hashing.splitmix64_torch(torch.from_numpy(xs.view(np.int64))).numpy().view(np.uint64)
    np.testing.assert_array_equal(got, _splitmix64_many(xs))
    assert [int(v) for v in got] == [hashing.splitmix64(v) for v in VALUES]


def test_as_int64_keeps_the_bits() -> None:
    for v in VALUES:
        c = hashing.as_int64(v)
        assert -(2**63) <= c < 2**63 and c & hashing.MASK64 == v
        assert hashing.as_int64(c) == c


def test_torch_splitmix64_chain_equals_python() -> None:
    """Keys XORed in as :func:`as_int64` and chained hashes (the attention-dropout mask's form)
    equal the Python-integer chain."""
    key = hashing.key_chain(7, 3, 2)
    xs = np.array(VALUES, dtype=np.uint64)
    z = hashing.splitmix64_torch(torch.from_numpy(xs.view(np.int64)) ^ hashing.as_int64(key))
    z = hashing.splitmix64_torch(z ^ 12345)
    want = [hashing.splitmix64(hashing.splitmix64(v ^ key) ^ 12345) for v in VALUES]
    assert [int(v) for v in z.numpy().view(np.uint64)] == want


@pytest.mark.parametrize("x", [0, 1, 7, 0xDEADBEEF, 2**31, 2**32 - 1])
def test_lowbias32_forms_equal_the_reference(x: int) -> None:
    want = _lowbias32_reference(x)
    assert int(hashing.lowbias32(torch.tensor([x], dtype=torch.int64))[0]) == want
    assert int(_lowbias32_many(np.array([x], dtype=np.uint64))[0]) == want


def test_lowbias32_known_values() -> None:
    """Fixed outputs (from the definition), so that any change of the hash shows."""
    got = hashing.lowbias32(torch.tensor([0, 1], dtype=torch.int64)).tolist()
    assert got == [0, 0x688990C0]


def test_key_derivations() -> None:
    s = hashing.splitmix64
    assert hashing.key_chain(3, 4, 5) == s(s(s(3) ^ 4) ^ 5)
    assert hashing.fold_key(3, 4) == s(s(hashing.GOLDEN + 3) + 4)
    assert hashing.key_chain(1, 3, 0) != hashing.key_chain(1, 3, 1)
    assert hashing.mix64(hashing.GOLDEN) == hashing.splitmix64(0)


def test_triton_copy_uses_the_same_constants() -> None:
    """The Triton kernels keep their own jitted lowbias32: same multipliers."""
    from pathlib import Path

    import fullgraph.kernels as kernels

    source = (Path(kernels.__file__).parent / "quantize_triton.py").read_text()
    for c in (hashing.LOWBIAS_C1, hashing.LOWBIAS_C2):
        assert f"0x{c:X}" in source
