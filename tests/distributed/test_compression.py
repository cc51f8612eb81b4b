"""Halo compression in one process: codecs, byte sizes, seeds, error feedback, option checks."""

from __future__ import annotations

import itertools

import pytest
import torch

from fullgraph.cli import build_parser
from fullgraph.cli import main as cli_main
from fullgraph.distributed.compression import (
    BACKWARD,
    CODECS,
    FORWARD,
    HaloCompression,
    check_codec,
    decode,
    encode,
    exchange_seed,
    record_bytes,
)
from fullgraph.errors import ConfigError
from fullgraph.kernels import cast_half, dequantize, quantize
from fullgraph.training.config import TrainConfig

BITS = {"int8": 8, "int4": 4, "int2": 2}


def rows(n: int, width: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, width, generator=gen) * torch.rand(n, 1, generator=gen) * 5


def reference(codec: str, x: torch.Tensor, seed: int) -> torch.Tensor:
    """What the receiver must get: ``dequantize(quantize(rows))`` or the half cast."""
    if codec in BITS:
        return dequantize(quantize(x, BITS[codec], stochastic=True, seed=seed))
    if codec in ("fp16", "bf16"):
        return cast_half(x, codec).float()
    return x


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("width", [1, 5, 16, 33])
def test_round_trip_is_dequantize_of_quantize_with_exact_size(codec: str, width: int) -> None:
    x = rows(7, width)
    buf = encode(codec, x, seed=42)
    rec = record_bytes(codec, width)
    assert buf.dtype == torch.uint8 and buf.shape == (7 * rec,)
    assert torch.equal(decode(codec, buf, 7, width), reference(codec, x, 42))
    # Rows are contiguous records: any row range of the buffer decodes to those rows.
    assert torch.equal(
        decode(codec, buf[2 * rec : 5 * rec], 3, width), decode(codec, buf, 7, width)[2:5]
    )
    assert decode(codec, encode(codec, x[:0], seed=1), 0, width).shape == (0, width)


def test_record_bytes_per_codec() -> None:
    assert [record_bytes(c, 256) for c in CODECS] == [1024, 512, 512, 264, 136, 72]
    assert [record_bytes(c, 5) for c in CODECS] == [20, 10, 10, 13, 11, 10]  # 5 codes: 5, 3, 2 B


def test_exchange_seeds_are_deterministic_and_distinct() -> None:
    grid = list(itertools.product([0, 1], [1, 2, 3], [0, 1, 2], [FORWARD, BACKWARD], range(4)))
    seeds = [exchange_seed(*g) for g in grid]
    assert seeds == [exchange_seed(*g) for g in grid]
    assert len(set(seeds)) == len(grid)
    assert all(0 <= s < 2**31 for s in seeds)


def test_step_numbers_exchanges_and_ends_even_on_error() -> None:
    comp = HaloCompression("int8", "none", seed=0, rank=0)
    assert comp.next_key() is None  # outside a step: float32
    with comp.step(5):
        assert [comp.next_key(), comp.next_key()] == [(5, 0), (5, 1)]
        assert comp.active((5, 0), FORWARD) and not comp.active((5, 0), BACKWARD)
    with pytest.raises(RuntimeError), comp.step(6):
        raise RuntimeError("boom")
    assert comp.next_key() is None


def test_error_feedback_carries_the_residual_and_bounds_the_drift() -> None:
    x = rows(16, 24, seed=3)
    ef = HaloCompression("int2", "int2", seed=1, rank=0, error_feedback=True)
    plain = HaloCompression("int2", "int2", seed=1, rank=0)
    sent_ef, sent_plain = torch.zeros_like(x), torch.zeros_like(x)
    steps = 40
    for epoch in range(1, steps + 1):
        key = (epoch, 0)
        residual = ef.residuals.get((0, FORWARD), torch.zeros_like(x)).clone()  # updated in place
        seed = exchange_seed(1, epoch, 0, FORWARD, 0)
        got = decode("int2", ef.encode(x, key, FORWARD), 16, 24)
        assert torch.equal(got, reference("int2", x + residual, seed))
        assert torch.equal(ef.residuals[(0, FORWARD)], (x + residual) - got)
        sent_ef += got
        sent_plain += decode("int2", plain.encode(x, key, FORWARD), 16, 24)
    # With feedback the sum of what was sent is steps * x minus the last residual.
    drift_ef = (sent_ef / steps - x).abs().mean()
    drift_plain = (sent_plain / steps - x).abs().mean()
    assert drift_ef < 0.25 * drift_plain
    assert plain.residuals == {} and ef.codec_s > 0


def test_bad_codec_names_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="none, fp16, bf16, int8, int4, int2"):
        check_codec("int3", "--compress-fwd")
    with pytest.raises(ConfigError, match="--compress-bwd must be one of none, fp16"):
        TrainConfig(compress_bwd="fp8")
    with pytest.raises(ConfigError, match="--error-feedback needs"):
        TrainConfig(error_feedback=True)
    cfg = TrainConfig(compress_fwd="int4", compress_bwd="bf16", error_feedback=True)
    assert cfg.compressed and cfg.to_dict()["compress_fwd"] == "int4"


def test_cli_rejects_bad_values_listing_choices(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["train", "--synthetic", "tiny", "--compress-fwd", "int3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--compress-fwd" in err and "'none', 'fp16', 'bf16', 'int8', 'int4', 'int2'" in err
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    train = sub.choices["train"]
    for dest in ("compress_fwd", "compress_bwd"):
        action = next(a for a in train._actions if a.dest == dest)
        assert tuple(action.choices) == CODECS and action.default == "none"
    assert cli_main(["train", "--synthetic", "tiny", "--error-feedback"]) == 2
    assert "--error-feedback needs --compress-fwd or --compress-bwd" in capsys.readouterr().err
