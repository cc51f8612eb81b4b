"""Range checks of numeric command-line options, run before any work.

Every check raises :class:`~fullgraph.errors.ConfigError` with one line naming the option, the
value and the accepted range, e.g. ``--lr must be a finite number > 0, got nan``.
"""

from __future__ import annotations

import math

from fullgraph.errors import ConfigError


def _describe(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return " and ".join(parts)


def check_number(
    option: str,
    value: float | int | None,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    optional: bool = False,
) -> None:
    """Check that ``value`` is a finite number in the given range.

    Args:
        option: the option's name for the message (``--lr``).
        value: the value given.
        low: smallest allowed value (``None``: unbounded).
        high: largest allowed value (``None``: unbounded).
        low_open: ``low`` itself is not allowed.
        high_open: ``high`` itself is not allowed.
        integer: the value must be an integer.
        optional: ``None`` is allowed (the option's default applies).

    Raises:
        ConfigError: the value is missing, not finite, not an integer or out of range.
    """
    if value is None:
        if optional:
            return
        raise ConfigError(f"{option} needs a value")
    kind = "an integer" if integer else "a finite number"
    rng = _describe(low, high, low_open, high_open)
    want = f"{option} must be {kind}{' ' + rng if rng else ''}, got {value!r}"
    if isinstance(value, bool):
        raise ConfigError(want)
    if integer and not isinstance(value, int):
        raise ConfigError(want)
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(want)
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(want)
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(want)


def check_probability(option: str, value: float | None, *, optional: bool = False) -> None:
    """A dropout probability: a finite number in ``[0, 1)``."""
    check_number(option, value, low=0.0, high=1.0, high_open=True, optional=optional)


def check_timeout(option: str, value: float) -> None:
    """A timeout in seconds: finite and positive."""
    check_number(option, value, low=0.0, low_open=True)


def check_path(option: str, value: str | None) -> None:
    """A path or name option, when given, is not empty (empty would silently mean none)."""
    if value is not None and not str(value).strip():
        raise ConfigError(f"{option} needs a value, got {value!r}")
