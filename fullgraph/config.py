"""Run configurations: dataclasses whose fields carry their default, help and check, and the
command line generated from them (one source for every option, as torchtitan's ``JobConfig``).

A configuration is a ``@dataclass`` deriving from :class:`Config` whose fields are declared
with :func:`option`::

    @dataclass
    class ModelOptions(Config):
        lr: float = option(0.01, "Adam learning rate", check=number(low=0, low_open=True))

``ModelOptions.add_arguments(parser)`` adds ``--lr`` (type, default and help from the field),
``ModelOptions.from_args(namespace)`` builds the instance, and every construction checks every
field (``__post_init__``), so the Python API refuses ``ModelOptions(lr=float("nan"))`` with the
same one-line :class:`~fullgraph.errors.ConfigError` as the command line: ``--lr must be a
finite number > 0, got nan``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fullgraph.errors import ConfigError

#: A field's check: called with the option's name and the field's value (of the field's type).
Check = Callable[[str, Any], None]
#: A configuration class (:meth:`Config.from_args` builds one of its own class).
C = TypeVar("C", bound="Config")


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    check: Check | None = None,
    choices: Sequence[Any] | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    cli: bool = True,
    required: bool = False,
) -> Any:
    """A configuration field with its default, help text and check.

    Args:
        default: the default value (a list, dict or set is copied for every instance).
        help: the ``--help`` text.
        check: called with ``(option name, value)``; raises :class:`ConfigError`.
        choices: the allowed values.
        metavar: the value's name in ``--help``.
        parse: turns the command-line string into the value (for lists); its
            :class:`ConfigError` is reported like any other check.
        cli: whether the field is a command-line option.
        required: the command line must give it (``--help``'s usage shows it without
            brackets; a missing one is argparse's one-line error). Checks of the field still
            run for configurations built in code.

    Returns:
        A :func:`dataclasses.field`.
    """
    meta = {
        "help": help,
        "check": check,
        "choices": tuple(choices) if choices is not None else None,
        "metavar": metavar,
        "parse": parse,
        "cli": cli,
        "required": required,
    }
    if isinstance(default, list | dict | set):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option_name(name: str) -> str:
    """The command-line spelling of field ``name`` (``log_json`` -> ``--log-json``)."""
    return "--" + name.replace("_", "-")


class Config:
    """Base of the run configurations: checks on construction, ``to_dict``, argparse glue."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                allowed = ", ".join(str(c) for c in choices)
                raise ConfigError(f"{option_name(f.name)} must be one of {allowed}, not {value!r}")
            check = f.metadata.get("check")
            if check is not None:
                check(option_name(f.name), value)
            if isinstance(value, float) and not math.isfinite(value):  # a check that let it by
                raise ConfigError(f"{option_name(f.name)} must be a finite number, got {value!r}")
        self.check()

    def check(self) -> None:
        """Rules between fields (override); raise :class:`ConfigError`."""

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (for logs and ``config.json``)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def add_arguments(
        cls,
        parser: argparse.ArgumentParser | argparse._ArgumentGroup,
        *,
        exclude: Sequence[str] = (),
    ) -> None:
        """Add one option per command-line field of ``cls`` to ``parser`` (or a group)."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if not f.metadata.get("cli", True) or f.name in exclude:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kind = _base_type(hints[f.name])
            help_text = f.metadata.get("help", "")
            flag = option_name(f.name)
            if kind is bool:
                parser.add_argument(flag, action="store_true", default=default, help=help_text)
                continue
            # a field with ``parse`` is parsed in :meth:`from_args`, so that its error is the
            # one-line ConfigError of every other check (argparse would print a usage block)
            parse = str if f.metadata.get("parse") else kind
            shown = ",".join(str(v) for v in default) if isinstance(default, list) else default
            if default is not None and "default" not in help_text:
                help_text = f"{help_text} (default {shown})" if help_text else f"default {shown}"
            parser.add_argument(
                flag,
                type=parse,
                default=default,
                choices=f.metadata.get("choices"),
                metavar=f.metadata.get("metavar"),
                required=f.metadata.get("required", False),
                help=help_text,
            )

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace, **overrides: Any) -> C:
        """An instance from the parsed options (fields absent from ``args`` keep defaults)."""
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if not hasattr(args, f.name):
                continue
            value = getattr(args, f.name)
            parse = f.metadata.get("parse")
            if parse is not None and isinstance(value, str):
                value = parse(value)
            values[f.name] = value
        return cls(**{**values, **overrides})


def _base_type(hint: Any) -> Any:
    """``int`` for ``int | None``, ``list`` for ``list[int]``, the type itself otherwise."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is list:
        return list
    if args and origin is not None:
        return _base_type(args[0])
    return hint


# -- checks ---------------------------------------------------------------------------------


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
    if isinstance(value, bool) or (integer and not isinstance(value, int)):
        raise ConfigError(want)
    if not isinstance(value, int | float):
        raise ConfigError(want)
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(want)
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(want)
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(want)


def number(**bounds: float | bool) -> Check:
    """A field check: :func:`check_number` with these bounds."""

    def check(option: str, value: Any) -> None:
        check_number(option, value, **bounds)

    return check


def check_probability(option: str, value: float | None, *, optional: bool = False) -> None:
    """A dropout probability: a finite number in ``[0, 1)``."""
    check_number(option, value, low=0.0, high=1.0, high_open=True, optional=optional)


def check_alpha(option: str, value: float | None) -> None:
    """A propagation's alpha (APPNP's teleport, Correct & Smooth's steps): unset, or a finite
    number in ``(0, 1]``."""
    if value is None:
        return
    check_number(option, value)
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{option} must be in (0, 1], not {value:g}")


def check_timeout(option: str, value: float) -> None:
    """A timeout in seconds: finite and positive."""
    check_number(option, value, low=0.0, low_open=True)


def check_path(option: str, value: str | None) -> None:
    """A path or name option, when given, is not empty (empty would silently mean none)."""
    if value is not None and not str(value).strip():
        raise ConfigError(f"{option} needs a value, got {value!r}")


#: Field checks used by several configurations.
POSITIVE_INT = number(low=1, integer=True)
OPTIONAL_POSITIVE_INT = number(low=1, integer=True, optional=True)
SEED = number(low=0, high=2**63 - 1, integer=True)
POSITIVE = number(low=0.0, low_open=True)
NON_NEGATIVE = number(low=0.0)
PROBABILITY = number(low=0.0, high=1.0, high_open=True)
OPTIONAL_PROBABILITY = number(low=0.0, high=1.0, high_open=True, optional=True)
