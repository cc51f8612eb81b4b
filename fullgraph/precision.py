"""``--precision``: float32, or bf16-mixed (Lightning's names), and the hardware check.

Under ``bf16-mixed`` the parameters, the optimiser state, the loss, the norms' statistics and
softmax stay float32; the forward pass's weight products and aggregations read their inputs in
bfloat16 (products accumulate in float32, aggregations in float64), forward halo rows travel in
bfloat16, and the backward pass is float32 (docs/train.md, "Precision"). ``auto`` is
bf16-mixed where it pays (:func:`auto_precision`): a GPU that computes bfloat16, or a CPU with
AMX; else 32 (a CPU with AVX-512 BF16 alone computes bfloat16, but bf16-mixed measured no
reliable speed-up there: the measurements are in docs/train.md, "Precision").

A run's precision is one :class:`Precision` policy, resolved once (:func:`resolve_precision`)
and given to the halo plan at its construction, where the layers read it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fullgraph.config import option
from fullgraph.errors import ConfigError

#: The values ``--precision`` accepts (``auto`` resolves to one of the first two).
PRECISIONS = ("32", "bf16-mixed", "auto")
#: The CPU flags that say the cores compute bfloat16 (AVX-512 BF16 or AMX).
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: The CPU flag of AMX's bfloat16 tiles: where ``auto`` picks bf16-mixed on a CPU.
AMX_FLAG = "amx_bf16"
_NO_GPU_BF16 = "this GPU has no bfloat16 support (torch.cuda.is_bf16_supported() is False)"
_NO_CPU_BF16 = "this CPU has neither avx512_bf16 nor amx_bf16 (see /proc/cpuinfo)"


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
        "bf16-mixed where it pays (a GPU with bfloat16, a CPU with AMX), else 32 "
        "(docs/train.md, Precision)" + default_help,
        check=check_precision,
        metavar="{32,bf16-mixed,auto}",
    )


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first ``flags`` line of ``/proc/cpuinfo``'s text (none if it has
    none)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpu_flags(f.read())
    except OSError:
        return frozenset()


def _cuda_bf16() -> bool:
    """Whether this process's GPU computes bfloat16 natively."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def bf16_unsupported(device: str) -> str | None:
    """``None`` when ``device`` (``cpu`` / ``cuda``) computes bfloat16 natively, else why not."""
    if device.startswith("cuda"):
        return None if _cuda_bf16() else _NO_GPU_BF16
    return None if any(flag in _cpu_flags() for flag in CPU_BF16_FLAGS) else _NO_CPU_BF16


def auto_precision(
    device: str, cpu_flags: str | frozenset[str] | None = None, cuda_bf16: bool | None = None
) -> tuple[str, str]:
    """What ``--precision auto`` resolves to on ``device``, and why (a clause for its line).

    bf16-mixed where it pays: on a GPU that computes bfloat16, or on a CPU with AMX
    (:data:`AMX_FLAG`); else 32. A CPU with AVX-512 BF16 and no AMX computes bfloat16, but
    bf16-mixed measured no reliable speed-up over float32 there (docs/train.md, "Precision").

    Args:
        device: ``cpu`` or ``cuda[:i]``.
        cpu_flags: the CPU's flags, as a set or as the text of a ``/proc/cpuinfo`` ``flags``
            line (default: this machine's).
        cuda_bf16: whether the GPU computes bfloat16 (default: asked of torch).
    """
    if device.startswith("cuda"):
        if _cuda_bf16() if cuda_bf16 is None else cuda_bf16:
            return "bf16-mixed", "this GPU computes bfloat16"
        return "32", _NO_GPU_BF16
    if cpu_flags is None:
        flags = _cpu_flags()
    elif isinstance(cpu_flags, str):
        flags = frozenset(cpu_flags.split(":", 1)[-1].split())
    else:
        flags = frozenset(cpu_flags)
    if AMX_FLAG in flags:
        return "bf16-mixed", f"this CPU has AMX ({AMX_FLAG})"
    if "avx512_bf16" in flags:
        return "32", (
            f"this CPU has avx512_bf16 but no AMX ({AMX_FLAG}), where bf16-mixed measured "
            f"no reliable speed-up (docs/train.md, Precision)"
        )
    return "32", _NO_CPU_BF16


@dataclass(frozen=True)
class Precision:
    """The precision policy of a run: what each kind of value is computed and sent in.

    Resolved once (:func:`resolve_precision`: the command scaffold, and ``Trainer``,
    ``Predictor`` and :func:`fullgraph.pyg.distribute` for Python callers), then handed to the
    halo plan at its construction; the rank context reads it there
    (:attr:`fullgraph.models.context.GraphContext.precision`).

    Attributes:
        name: ``32`` or ``bf16-mixed`` (what configs, logs and model files record).
    """

    name: str

    def __post_init__(self) -> None:
        if self.name not in RESOLVED:
            raise ConfigError(
                f"precision {self.name!r} is not resolved: one of {', '.join(RESOLVED)} "
                f"(resolve {PRECISIONS[-1]!r} with fullgraph.precision.resolve_precision)"
            )

    @property
    def mixed(self) -> bool:
        """Whether the forward pass computes in bfloat16 (``bf16-mixed``)."""
        return self.name == "bf16-mixed"

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the forward pass's weight products and aggregations read their inputs in
        (``None``: their inputs' own, float32)."""
        return torch.bfloat16 if self.mixed else None

    @property
    def backward_dtype(self) -> torch.dtype | None:
        """The dtype the backward pass's products and aggregations read their inputs in where
        the block tree makes every sum over nodes the same bits at any rank count (a part with
        fixed node blocks): bfloat16 under ``bf16-mixed`` (weight-gradient products per block,
        input gradients, ``A^T dY``; bias sums, the tree and the optimiser stay float32).
        ``None``: float32 (also wherever the tree is not in force)."""
        return torch.bfloat16 if self.mixed else None

    @contextlib.contextmanager
    def autocast(self, device: torch.device | str) -> Iterator[None]:
        """``torch.autocast`` to bfloat16 for plain torch modules under ``bf16-mixed`` (the
        mini-batch baseline); nothing under 32."""
        if not self.mixed:
            yield
            return
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            yield

    def __str__(self) -> str:
        return self.name


#: The resolved values: what :class:`Precision` holds.
RESOLVED = PRECISIONS[:2]
#: float32 throughout: the default policy.
FLOAT32 = Precision("32")


def resolve_precision(requested: str, device: str) -> tuple[Precision, str | None]:
    """``requested`` (``32``, ``bf16-mixed`` or ``auto``) on ``device`` as a policy, and, for
    ``auto``, the line that says what it resolved to and why (:func:`auto_precision`; else
    ``None``).

    Raises:
        ConfigError: an unknown value, or ``bf16-mixed`` asked for on a device without
            bfloat16.
    """
    check_precision("--precision", requested)
    if requested == "32":
        return FLOAT32, None
    if requested == "auto":
        precision, why = auto_precision(device)
        name = "float32" if precision == "32" else precision
        return Precision(precision), f"--precision auto: {name}, {why}"
    why = bf16_unsupported(device)
    if why is None:
        return Precision("bf16-mixed"), None
    raise ConfigError(f"--precision bf16-mixed: {why}; use --precision 32 (or auto)")
