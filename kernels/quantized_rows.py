"""The record format of quantized rows, shared by the dispatcher and both kernel paths.

A row of F codes at b bits takes ``ceil(F * b / 8)`` packed bytes plus 8 bytes of parameters
(float32 minimum and scale); :meth:`QuantizedRows.to_bytes` lays each row's record out
contiguously so that row ranges can be sliced for an all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fullgraph.errors import ConfigError, FullgraphError

BITS = (8, 4, 2)
PARAM_BYTES = 8  # float32 row_min + float32 row_scale


def packed_width(num_cols: int, bits: int) -> int:
    """Bytes of one packed row: ``ceil(num_cols * bits / 8)``."""
    return (num_cols * bits + 7) // 8


def record_nbytes(num_cols: int, bits: int) -> int:
    """Bytes one row takes on the wire: packed codes plus float32 min and scale."""
    return packed_width(num_cols, bits) + PARAM_BYTES


@dataclass
class QuantizedRows:
    """Quantized rows: packed codes plus per-row float32 minimum and scale.

    Shapes:
        - ``packed``: uint8 [N, ceil(num_cols * bits / 8)]
        - ``row_min``, ``row_scale``: float32 [N]
    """

    packed: torch.Tensor
    row_min: torch.Tensor
    row_scale: torch.Tensor
    bits: int
    num_cols: int

    @property
    def num_rows(self) -> int:
        """Number of rows N."""
        return int(self.packed.shape[0])

    @property
    def nbytes(self) -> int:
        """Exact bytes to send: packed codes + 8 bytes of parameters per row."""
        return self.num_rows * record_nbytes(self.num_cols, self.bits)

    def to_bytes(self) -> torch.Tensor:
        """One uint8 buffer [N * record_nbytes]: per row, the packed codes, then min, then scale.

        Rows are contiguous records, so ``buf[a * rec : b * rec]`` holds rows ``a..b-1``.
        """
        n = self.num_rows
        params = torch.stack([self.row_min, self.row_scale], dim=1).contiguous()
        return torch.cat([self.packed, params.view(torch.uint8).view(n, PARAM_BYTES)], 1).view(-1)

    @classmethod
    def from_bytes(cls, buf: torch.Tensor, n: int, f: int, bits: int) -> QuantizedRows:
        """Rebuild from :meth:`to_bytes` output of ``n`` rows, ``f`` columns, ``bits`` bits."""
        rec = check_records(buf, n, f, bits, "QuantizedRows.from_bytes")
        rows = buf.reshape(n, rec)
        width = rec - PARAM_BYTES
        # A fresh 1-D copy: offset 0 and unit stride even when n = 1 (a view of the buffer).
        params = rows[:, width:].reshape(-1).clone().view(torch.float32).view(n, 2)
        return cls(
            rows[:, :width].contiguous(), params[:, 0].clone(), params[:, 1].clone(), bits, f
        )


def check_records(buf: torch.Tensor, n: int, f: int, bits: int, who: str) -> int:
    """Check ``buf`` holds ``n`` records of ``f`` columns at ``bits`` bits; the record size."""
    check_bits(bits)
    rec = record_nbytes(f, bits)
    if buf.dtype != torch.uint8 or buf.numel() != n * rec:
        raise FullgraphError(
            f"{who}: buffer of {buf.numel()} {buf.dtype} values, expected {n * rec} uint8 for "
            f"{n} rows x {f} columns at {bits} bits"
        )
    return rec


def check_bits(bits: int) -> None:
    """Raise :class:`ConfigError` unless ``bits`` is one of :data:`BITS`."""
    if bits not in BITS:
        raise ConfigError(f"quantize: bits must be one of {BITS}, got {bits}")
