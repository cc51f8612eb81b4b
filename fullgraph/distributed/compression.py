"""Compressed halo rows: codecs, per-exchange seeds and the error-feedback state of one rank.

A codec turns the rows a rank sends, float [S, W], into ONE uint8 buffer of ``S * record``
bytes in which every row is a contiguous record, so that the all-to-all can cut it by rows (the
counts become ``rows * record`` bytes) and the per-row parameters travel with the codes:

- ``none``: float32 (4 W bytes a row; the uncompressed path never builds it);
- ``fp16`` / ``bf16``: :func:`fullgraph.kernels.cast_half` (2 W bytes a row, round to nearest);
- ``int8`` / ``int4`` / ``int2``: :func:`fullgraph.kernels.quantize`, per-row min and scale,
  stochastic rounding (unbiased), codes packed, then float32 min and scale
  (``ceil(W * bits / 8) + 8`` bytes a row, :meth:`QuantizedRows.to_bytes`).

Seeds of the stochastic rounding come from ``(seed, epoch, exchange, direction, rank)`` through
a splitmix64 chain (:func:`exchange_seed`), so a run is reproducible and every exchange draws
its own noise. ``exchange`` counts the halo exchanges of one training step in forward order
(the precomputed first aggregation does not exchange and takes no number).

:class:`HaloCompression` is the per-rank state: the codec of each direction, the step being
trained (evaluation and setup exchanges run outside a step and always send float32), the
error-feedback residuals (per exchange and direction, one row per row sent) and the seconds
spent encoding and decoding.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from fullgraph.errors import ConfigError
from fullgraph.hashing import key_chain
from fullgraph.kernels import cast_half, dequantize_bytes, quantize_to_bytes, record_nbytes

CODECS = ("none", "fp16", "bf16", "int8", "int4", "int2")
FORWARD, BACKWARD = 0, 1
_BITS = {"int8": 8, "int4": 4, "int2": 2}
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check_codec(value: str, option: str = "--compress-fwd") -> str:
    """Return ``value`` when it names a codec, else raise naming the valid ones.

    Raises:
        ConfigError: ``value`` is not one of :data:`CODECS`.
    """
    if value not in CODECS:
        raise ConfigError(f"{option} must be one of {', '.join(CODECS)}, got {value!r}")
    return value


def record_bytes(codec: str, width: int) -> int:
    """Bytes one row of ``width`` values takes on the wire under ``codec``."""
    check_codec(codec, "codec")
    if codec in _BITS:
        return record_nbytes(width, _BITS[codec])
    return width * (2 if codec in _HALF else 4)


def encode(codec: str, rows: torch.Tensor, seed: int, stochastic: bool = True) -> torch.Tensor:
    """Encode ``rows`` into one byte buffer of contiguous per-row records.

    Args:
        codec: one of :data:`CODECS`.
        rows: float [S, W].
        seed: seed of the stochastic rounding (integer codecs).
        stochastic: stochastic (unbiased) or nearest rounding for the integer codecs.

    Returns:
        uint8 [S * record_bytes(codec, W)].
    """
    check_codec(codec, "codec")
    if codec in _BITS:
        return quantize_to_bytes(rows, _BITS[codec], stochastic=stochastic, seed=seed)
    if codec in _HALF:
        return cast_half(rows, codec).contiguous().view(torch.uint8).reshape(-1)
    return rows.to(torch.float32).contiguous().view(torch.uint8).reshape(-1)


def decode(codec: str, buf: torch.Tensor, num_rows: int, width: int) -> torch.Tensor:
    """Float32 [num_rows, width] rows from an :func:`encode` buffer."""
    check_codec(codec, "codec")
    if codec in _BITS:
        return dequantize_bytes(buf, num_rows, width, _BITS[codec])
    dtype = _HALF.get(codec, torch.float32)
    return buf.view(dtype).reshape(num_rows, width).to(torch.float32)


def exchange_seed(seed: int, epoch: int, exchange: int, direction: int, rank: int) -> int:
    """The rounding seed of one exchange: a splitmix64 chain of its coordinates, 31 bits."""
    return key_chain(seed, epoch, exchange, direction, rank) & 0x7FFFFFFF


class HaloCompression:
    """Compression of one rank's halo exchange during training steps.

    Args:
        forward: codec of forward activations.
        backward: codec of backward gradients.
        seed: the run's seed.
        rank: this rank.
        error_feedback: add the last quantization residual of each row sent before the next.
        stochastic: stochastic rounding for the integer codecs (nearest when ``False``).
    """

    def __init__(
        self,
        forward: str,
        backward: str,
        seed: int,
        rank: int,
        error_feedback: bool = False,
        stochastic: bool = True,
    ) -> None:
        self.codecs = (
            check_codec(forward, "--compress-fwd"),
            check_codec(backward, "--compress-bwd"),
        )
        self.seed, self.rank = int(seed), int(rank)
        self.error_feedback = bool(error_feedback)
        self.stochastic = bool(stochastic)
        self.residuals: dict[tuple[int, int], torch.Tensor] = {}
        self.codec_s = 0.0
        self._epoch: int | None = None
        self._exchanges = 0

    @contextlib.contextmanager
    def step(self, epoch: int) -> Iterator[None]:
        """Compress the exchanges of one training step (forward and backward) of ``epoch``."""
        self._epoch, self._exchanges = int(epoch), 0
        try:
            yield
        finally:
            self._epoch = None

    def next_key(self) -> tuple[int, int] | None:
        """``(epoch, exchange)`` of the next forward exchange, or ``None`` outside a step."""
        if self._epoch is None:
            return None
        key = (self._epoch, self._exchanges)
        self._exchanges += 1
        return key

    def active(self, key: tuple[int, int] | None, direction: int) -> bool:
        """Whether an exchange with ``key`` in ``direction`` is compressed."""
        return key is not None and self.codecs[direction] != "none"

    def encode(self, rows: torch.Tensor, key: tuple[int, int], direction: int) -> torch.Tensor:
        """Encode the rows this rank sends (with the residual added under error feedback).

        Shapes:
            - ``rows``: [S, W] -> uint8 [S * record_bytes(codec, W)].
        """
        t0 = time.perf_counter()
        codec = self.codecs[direction]
        seed = exchange_seed(self.seed, key[0], key[1], direction, self.rank)
        x = rows.detach().to(torch.float32)
        slot = (key[1], direction)
        residual = self.residuals.get(slot) if self.error_feedback else None
        if self.error_feedback and (residual is None or residual.shape != x.shape):
            residual = self.residuals[slot] = torch.zeros(x.shape, device=x.device)
        if residual is not None and codec in _BITS:  # one pass, residual updated in place
            buf = quantize_to_bytes(x, _BITS[codec], self.stochastic, seed, residual)
        elif residual is not None:
            x = x + residual
            buf = encode(codec, x, seed, self.stochastic)
            torch.sub(x, decode(codec, buf, x.shape[0], x.shape[1]), out=residual)
        else:
            buf = encode(codec, x, seed, self.stochastic)
        self.codec_s += time.perf_counter() - t0
        return buf

    def decode(self, buf: torch.Tensor, num_rows: int, width: int, direction: int) -> torch.Tensor:
        """Float32 [num_rows, width] rows received in ``direction``."""
        t0 = time.perf_counter()
        out = decode(self.codecs[direction], buf, num_rows, width)
        self.codec_s += time.perf_counter() - t0
        return out
