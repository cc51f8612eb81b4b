"""``--precision``: float32, or bf16-mixed (Lightning's names), and the hardware check.

Under ``bf16-mixed`` the parameters, the optimiser state, the loss, the norms' statistics and
softmax stay float32; the forward pass's weight products and aggregations read their inputs in
bfloat16 (products accumulate in float32, aggregations in float64), forward halo rows travel in
bfloat16, and the backward pass is float32 (docs/train.md, "Precision"). ``auto`` is
bf16-mixed where the device computes bfloat16 natively, else 32.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from fullgraph.config import option
from fullgraph.errors import ConfigError

#: The values ``--precision`` accepts (``auto`` resolves to one of the first two).
PRECISIONS = ("32", "bf16-mixed", "auto")
#: The CPU flags that say the cores compute bfloat16 (AVX-512 BF16 or AMX).
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def check_precision(option: str, value: str | None) -> None:
    """A field check: ``None`` (the command's default) or one of :data:`PRECISIONS`."""
    if value is not None and value not in PRECISIONS:
        raise ConfigError(f"{option} must be one of {', '.join(PRECISIONS)}, not {value!r}")


def precision_option(default: str | None = "32", default_help: str = "") -> Any:
    """The ``--precision`` field of a configuration (train, minibatch, predict).

    Args:
        default: the field's default (``None``: the command decides, ``default_help`` says how).
        default_help: the help text's last words for a ``None`` default.
    """
    return option(
        default,
        "32 (float32) or bf16-mixed: weight products, aggregations and forward halo rows in "
        "bfloat16, parameters, optimiser state, norms, softmax and loss in float32; auto: "
        "bf16-mixed where the device computes bfloat16, else 32 (docs/train.md, Precision)"
        + default_help,
        check=check_precision,
        metavar="{32,bf16-mixed,auto}",
    )


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_unsupported(device: str) -> str | None:
    """``None`` when ``device`` (``cpu`` / ``cuda``) computes bfloat16 natively, else why not."""
    if device.startswith("cuda"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        return "this GPU has no bfloat16 support (torch.cuda.is_bf16_supported() is False)"
    if any(flag in _cpu_flags() for flag in CPU_BF16_FLAGS):
        return None
    return "this CPU has neither avx512_bf16 nor amx_bf16 (see /proc/cpuinfo)"


def resolve_precision(requested: str, device: str) -> tuple[str, str | None]:
    """``(precision, note)``: ``32`` or ``bf16-mixed``, and the line to print when ``auto``
    fell back to 32 (else ``None``).

    Raises:
        ConfigError: ``bf16-mixed`` asked for on a device without bfloat16.
    """
    check_precision("--precision", requested)
    if requested == "32":
        return "32", None
    why = bf16_unsupported(device)
    if why is None:
        return "bf16-mixed", None
    if requested == "auto":
        return "32", f"--precision auto: {why}; training in float32"
    raise ConfigError(f"--precision bf16-mixed: {why}; use --precision 32 (or auto)")


def compute_dtype(precision: str) -> torch.dtype | None:
    """The dtype weight products and aggregations read (``None``: their inputs' own)."""
    return torch.bfloat16 if precision == "bf16-mixed" else None


@contextlib.contextmanager
def autocast(device: torch.device | str, precision: str) -> Iterator[None]:
    """``torch.autocast`` to bfloat16 for plain torch modules (``F.linear`` of GAT's
    projection, GIN's MLP, residual projections) under ``bf16-mixed``; nothing under 32."""
    if precision != "bf16-mixed":
        yield
        return
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        yield
