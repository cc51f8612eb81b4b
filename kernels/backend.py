"""Which back-end runs a kernel: Triton on CUDA, the CPU kernel on CPU, plain torch anywhere.

``FULLGRAPH_KERNEL=triton|cpu|torch`` forces one back-end (a forced back-end that cannot run
raises :class:`~fullgraph.errors.ConfigError`); unset or ``auto`` chooses by device and falls back
to the torch reference with a warning when the preferred back-end is unavailable. Triton on CPU
tensors runs through Triton's interpreter, and only when ``TRITON_INTERPRET=1`` is set.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

from fullgraph.errors import ConfigError

BACKENDS = ("triton", "cpu", "torch")
ENV_VAR = "FULLGRAPH_KERNEL"


def requested_backend() -> str:
    """The back-end named by ``FULLGRAPH_KERNEL`` (``auto`` when unset or empty)."""
    name = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
    if name != "auto" and name not in BACKENDS:
        raise ConfigError(f"{ENV_VAR}={name!r} is not one of auto, {', '.join(BACKENDS)}")
    return name


def triton_interpret() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (looked up once per process: it cannot change)."""
    return importlib.util.find_spec(module) is not None


def _why_not(name: str, device: torch.device) -> str | None:
    """``None`` when back-end ``name`` can run on ``device``, else the reason it cannot."""
    if name == "torch":
        return None
    if name == "cpu":
        if device.type != "cpu":
            return f"the cpu back-end cannot run on {device} tensors"
        if not _installed("numba"):
            return "numba is not installed"
        return None
    if not _installed("triton"):
        return "triton is not installed"
    if device.type == "cuda":
        return None
    if device.type == "cpu" and triton_interpret():
        return None
    return f"triton cannot run on {device} tensors (set TRITON_INTERPRET=1 for CPU tensors)"


def select_backend(device: torch.device, kernel: str) -> str:
    """Choose the back-end for ``kernel`` (a name for messages) on tensors of ``device``.

    Args:
        device: device of the operands.
        kernel: name of the operation, used in messages.

    Returns:
        One of :data:`BACKENDS`.

    Raises:
        ConfigError: when ``FULLGRAPH_KERNEL`` forces a back-end that cannot run here.
    """
    name = requested_backend()
    if name != "auto":
        why = _why_not(name, device)
        if why is not None:
            raise ConfigError(f"{ENV_VAR}={name}: {kernel}: {why}")
        return name
    preferred = "triton" if device.type == "cuda" else "cpu"
    if device.type not in ("cuda", "cpu"):
        preferred = "torch"
    why = _why_not(preferred, device)
    if why is None:
        return preferred
    warnings.warn(
        f"fullgraph.kernels.{kernel}: {preferred} back-end unavailable ({why}); "
        "using the slower torch reference",
        RuntimeWarning,
        stacklevel=2,
    )
    return "torch"


def numba_or_torch(device: torch.device, dtype: torch.dtype, kernel: str) -> str:
    """The back-end of a kernel with a numba CPU kernel and a torch reference only (no Triton):
    ``numba`` for float32 / float64 CPU tensors (unless ``FULLGRAPH_KERNEL`` says otherwise,
    see :func:`select_backend`), else ``torch``."""
    name = select_backend(device, kernel)
    if name == "cpu" and dtype in (torch.float32, torch.float64):
        return "numba"
    return "torch"
