"""Quantization: error bounds, exact byte sizes, packing, unbiasedness, CPU/Triton parity."""

from __future__ import annotations

import math

import pytest
import torch

from fullgraph.errors import ConfigError, FullgraphError
from fullgraph.kernels import (
    QuantizedRows,
    cast_half,
    dequantize,
    packed_width,
    quantize,
    record_nbytes,
)

WIDTHS = [1, 3, 17, 33, 130]


@pytest.fixture(params=["cpu", "triton"])
def backend(request, monkeypatch) -> str:
    monkeypatch.setenv("FULLGRAPH_KERNEL", request.param)
    if request.param == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return request.param


def sample(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 10
    X[1] = 2.5  # a constant row: scale 0, exact
    return X


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("width", WIDTHS)
def test_deterministic_round_trip_error_at_most_half_a_step(backend, bits, width):
    X = sample(6, width)
    q = quantize(X, bits, stochastic=False)
    assert q.packed.dtype == torch.uint8 and q.packed.shape == (6, math.ceil(width * bits / 8))
    assert q.row_min.dtype == torch.float32 and q.row_scale.dtype == torch.float32
    Y = dequantize(q)
    assert Y.shape == X.shape and Y.dtype == torch.float32
    bound = q.row_scale[:, None] / 2 * (1 + 1e-5) + 1e-6
    assert bool(((Y - X).abs() <= bound).all())
    torch.testing.assert_close(Y[1], X[1], atol=0, rtol=0)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_stochastic_round_trip_error_below_one_step(backend, bits):
    X = sample(5, 37, seed=1)
    q = quantize(X, bits, stochastic=True, seed=11)
    Y = dequantize(q)
    assert bool(((Y - X).abs() <= q.row_scale[:, None] * (1 + 1e-5) + 1e-6).all())


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_cpu_and_triton_paths_give_identical_bytes(monkeypatch, bits, stochastic, width):
    X = sample(7, width, seed=width)
    out = {}
    for name in ("cpu", "triton"):
        monkeypatch.setenv("FULLGRAPH_KERNEL", name)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        q = quantize(X, bits, stochastic=stochastic, seed=1234)
        out[name] = (q.to_bytes(), dequantize(q))
    assert torch.equal(out["cpu"][0], out["triton"][0])
    assert torch.equal(out["cpu"][1], out["triton"][1])


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("width", WIDTHS)
def test_exact_byte_sizes_and_buffer_round_trip(bits, width):
    X = sample(9, width)
    q = quantize(X, bits, seed=3)
    per_row = math.ceil(width * bits / 8) + 8
    assert packed_width(width, bits) == per_row - 8 and record_nbytes(width, bits) == per_row
    assert q.nbytes == 9 * per_row
    buf = q.to_bytes()
    assert buf.dtype == torch.uint8 and buf.shape == (q.nbytes,)
    back = QuantizedRows.from_bytes(buf, 9, width, bits)
    assert torch.equal(back.packed, q.packed) and torch.equal(back.row_min, q.row_min)
    assert torch.equal(back.row_scale, q.row_scale)
    # Row records are contiguous: a slice of the buffer is a slice of the rows.
    part = QuantizedRows.from_bytes(buf[2 * per_row : 5 * per_row], 3, width, bits)
    torch.testing.assert_close(dequantize(part), dequantize(q)[2:5], atol=0, rtol=0)
    with pytest.raises(FullgraphError, match="expected"):
        QuantizedRows.from_bytes(buf[:-1], 9, width, bits)


def test_packing_layout_of_odd_widths(backend):
    # Codes 0,1,2,3,0 at 2 bits (row min 0, max 3): byte 0 = 0 | 1<<2 | 2<<4 | 3<<6 = 228,
    # byte 1 holds the fifth code (0) and zero padding.
    X = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.0], [3.0, 3.0, 0.0, 3.0, 3.0]])
    q = quantize(X, 2, stochastic=False)
    assert q.packed.tolist() == [[228, 0], [3 | 3 << 2 | 0 << 4 | 3 << 6, 3]]
    q4 = quantize(torch.tensor([[0.0, 15.0, 7.0]]), 4, stochastic=False)
    assert q4.packed.tolist() == [[0 | 15 << 4, 7]]
    torch.testing.assert_close(dequantize(q4), torch.tensor([[0.0, 15.0, 7.0]]))


def mean_over_seeds(X: torch.Tensor, bits: int, stochastic: bool, draws: int) -> torch.Tensor:
    return torch.stack(
        [dequantize(quantize(X, bits, stochastic=stochastic, seed=s)) for s in range(draws)]
    ).mean(0)


def test_stochastic_rounding_is_unbiased():
    """Mean of many stochastic round trips within 5 standard errors of X, for every element.

    Each element's round trip is ``lo + scale * Bernoulli(p)``: standard deviation at most
    ``scale / 2``; over D draws the mean's standard error is at most ``scale / (2 sqrt(D))``.
    Deterministic rounding fails the same check (second half), so the check has teeth.
    """
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(4, 250, generator=gen) * 3
    X[:, 0], X[:, 1] = 0.0, 3.0  # pin each row's min and max
    draws, bits = 400, 2
    scale = 3.0 / 3
    limit = 5 * scale / (2 * math.sqrt(draws))
    err = (mean_over_seeds(X, bits, True, draws) - X).abs()
    assert float(err.max()) <= limit, f"max |bias| {float(err.max()):.4f} > {limit:.4f}"
    det = (mean_over_seeds(X, bits, False, 1) - X).abs()
    assert float(det.max()) > limit


def test_seed_none_draws_from_torch_generator():
    X = sample(3, 40)
    torch.manual_seed(5)
    a = quantize(X, 4).packed
    torch.manual_seed(5)
    b = quantize(X, 4).packed
    assert torch.equal(a, b)
    assert not torch.equal(quantize(X, 4, seed=1).packed, quantize(X, 4, seed=2).packed)


def test_bad_arguments_raise():
    with pytest.raises(ConfigError, match="bits"):
        quantize(torch.ones(2, 3), 3)
    with pytest.raises(FullgraphError, match="2-D float"):
        quantize(torch.ones(3, dtype=torch.float32), 8)
    with pytest.raises(ConfigError, match="kind"):
        cast_half(torch.ones(2), "fp8")


def test_cast_half():
    X = torch.tensor([1.0, -70000.0, 1e5, 0.1])
    h = cast_half(X, "fp16")
    assert h.dtype == torch.float16 and bool(torch.isfinite(h).all())
    assert float(h[2]) == 65504.0
    b = cast_half(X, "bf16")
    assert b.dtype == torch.bfloat16
    torch.testing.assert_close(b.float(), X, rtol=1e-2, atol=0)


@pytest.mark.parametrize("rows", [0, 1])
def test_zero_and_one_row_round_trip(backend, rows):
    X = torch.randn(rows, 11)
    q = quantize(X, 4, stochastic=False)
    back = QuantizedRows.from_bytes(q.to_bytes()[: q.nbytes], rows, 11, 4)
    Y = dequantize(back)
    assert Y.shape == (rows, 11) and q.nbytes == rows * record_nbytes(11, 4)
    assert bool(((Y - X).abs() <= q.row_scale[:, None] / 2 * (1 + 1e-5) + 1e-6).all())


PARITY_WIDTHS = [1, 3, 17, 300]


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == torch.float32:  # compare bit patterns: -0.0 != 0.0, NaN == NaN
        a, b = a.view(torch.int32), b.view(torch.int32)
    assert torch.equal(a, b)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 70])
@pytest.mark.parametrize("width", PARITY_WIDTHS)
def test_numba_and_torch_paths_give_identical_bytes(bits, stochastic, rows, width):
    from fullgraph.kernels.quantize import dequantize_torch, quantize_torch, seed_key
    from fullgraph.kernels.quantize_cpu import dequantize_cpu, quantize_cpu

    gen = torch.Generator().manual_seed(width)
    X = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 10
    if rows > 2:
        X[1] = 2.5  # constant row: scale 0
        X[2] = 0.0
    key = seed_key(4321)
    ref = quantize_torch(X, bits, stochastic, key)
    got = quantize_cpu(X, bits, stochastic, key)
    assert_same_bits(got.packed, ref.packed)
    assert_same_bits(got.row_min, ref.row_min)
    assert_same_bits(got.row_scale, ref.row_scale)
    assert (got.bits, got.num_cols) == (bits, width)
    assert_same_bits(dequantize_cpu(ref), dequantize_torch(ref))


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [False, True])
def test_numba_path_on_non_contiguous_and_double_input(bits, stochastic):
    from fullgraph.kernels.quantize import quantize_torch, seed_key
    from fullgraph.kernels.quantize_cpu import quantize_cpu

    base = torch.randn(40, 2 * 33, dtype=torch.float64)
    key = seed_key(7)
    for X in (base[::3, ::2], base.t()[:, ::2], base.float()[:, 1::2]):
        assert not X.is_contiguous()
        ref = quantize_torch(X, bits, stochastic, key)
        got = quantize_cpu(X, bits, stochastic, key)
        assert_same_bits(got.packed, ref.packed)
        assert_same_bits(got.row_min, ref.row_min)
        assert_same_bits(got.row_scale, ref.row_scale)


def test_cpu_backend_dispatches_to_numba(monkeypatch):
    import fullgraph.kernels.quantize_cpu as quantize_cpu

    calls = []
    real_q, real_d = quantize_cpu.quantize_cpu, quantize_cpu.dequantize_cpu
    monkeypatch.setattr(quantize_cpu, "quantize_cpu", lambda *a: calls.append("q") or real_q(*a))
    monkeypatch.setattr(quantize_cpu, "dequantize_cpu", lambda q: calls.append("d") or real_d(q))
    X = sample(5, 20)
    monkeypatch.setenv("FULLGRAPH_KERNEL", "cpu")
    q = quantize(X, 4, seed=9)
    Y = dequantize(q)
    assert calls == ["q", "d"]
    monkeypatch.setenv("FULLGRAPH_KERNEL", "torch")
    q_ref = quantize(X, 4, seed=9)
    assert torch.equal(q.to_bytes(), q_ref.to_bytes())
    assert torch.equal(Y, dequantize(q_ref)) and calls == ["q", "d"]


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("width", [1, 17, 256])
def test_wire_records_equal_the_torch_path(bits, stochastic, width):
    """numba's one-pass records (with and without error feedback) == the torch sequence:
    add, quantize, to_bytes; dequantize, subtract; and decoding them gives the same rows."""
    from fullgraph.kernels import dequantize_bytes, quantize_to_bytes
    from fullgraph.kernels.quantize import dequantize_torch, quantize_torch, seed_key

    gen = torch.Generator().manual_seed(width + bits)
    X = torch.randn(70, width, generator=gen) * 3
    X[2] = 1.5  # a row that, with a zero residual, is constant
    res_cpu = torch.zeros(70, width)
    res_ref = torch.zeros(70, width)
    for step in range(3):  # the residual of one step feeds the next
        got = quantize_to_bytes(X, bits, stochastic, seed=step, residual=res_cpu)
        v = X + res_ref
        ref = quantize_torch(v, bits, stochastic, seed_key(step))
        res_ref = v - dequantize_torch(ref)
        assert_same_bits(got, ref.to_bytes())
        assert_same_bits(res_cpu, res_ref)
        assert_same_bits(dequantize_bytes(got, 70, width, bits), dequantize_torch(ref))
    assert width == 1 or res_cpu.abs().max() > 0  # one column: every row is constant
    plain = quantize_to_bytes(X, bits, stochastic, seed=9)
    assert_same_bits(plain, quantize_torch(X, bits, stochastic, seed_key(9)).to_bytes())
    with pytest.raises(FullgraphError, match="residual must be contiguous float32"):
        quantize_to_bytes(X, bits, residual=torch.zeros(70, width + 1))
    with pytest.raises(FullgraphError, match="dequantize_bytes: buffer of"):
        dequantize_bytes(plain[:-1], 70, width, bits)
