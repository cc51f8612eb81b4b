"""The layer kinds of the full-batch models, behind one small registry.

A layer kind is one class deriving from :class:`GraphLayer` in one module of this package,
registered with :func:`register_layer` under its name (``gcn``, ``sage``). It declares the
layer options it takes (:attr:`GraphLayer.accepts`; :func:`check_options` refuses the others),
builds its aggregation operator from the part (:meth:`GraphLayer.operator`, once per rank),
computes its output from its input and the rank's
:class:`~fullgraph.models.context.GraphContext`, and says how it exports to PyG
(:attr:`GraphLayer.pyg`) and how the memory model replays it (:attr:`GraphLayer.replay`). A new
kind is one new file here: the modules of this package are found and imported when a kind is
first looked up.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import fields

from fullgraph.errors import ConfigError
from fullgraph.models.layers.base import (
    LAYERS,
    GraphLayer,
    LayerOptions,
    PygExport,
    register_layer,
)

__all__ = [
    "GraphLayer",
    "LayerOptions",
    "PygExport",
    "check_options",
    "joined",
    "kinds_with",
    "layer_class",
    "layer_kinds",
    "option_names",
    "register_layer",
]


def _import_layer_modules() -> None:
    """Import every module of this package, so that their layer kinds register."""
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


def layer_class(kind: str) -> type[GraphLayer]:
    """The layer class registered as ``kind``.

    Raises:
        ConfigError: no such kind (the known ones are listed).
    """
    if kind not in LAYERS:
        _import_layer_modules()
    if kind not in LAYERS:
        raise ConfigError(f"unknown model {kind!r} (choose from {', '.join(layer_kinds())})")
    return LAYERS[kind]


def layer_kinds() -> tuple[str, ...]:
    """Names of every layer kind, sorted."""
    _import_layer_modules()
    return tuple(sorted(LAYERS))


def kinds_with(predicate: Callable[[type[GraphLayer]], bool]) -> list[str]:
    """The kinds whose class satisfies ``predicate``, by name, a kind derived from another
    after those it derives from (``sage``, then ``graphconv``)."""
    _import_layer_modules()
    registered = set(LAYERS.values())

    def order(kind: str) -> tuple[int, str]:
        return (sum(c in registered for c in LAYERS[kind].__mro__[1:]), kind)

    return sorted((kind for kind, cls in LAYERS.items() if predicate(cls)), key=order)


def joined(kinds: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} and {kinds[-1]}"


def option_names() -> tuple[str, ...]:
    """The layer options (:class:`LayerOptions`' fields, ``fullgraph train``'s options of the
    same names), in the order :func:`check_options` checks them."""
    return tuple(f.name for f in fields(LayerOptions))


def check_options(kind: str, given: Mapping[str, object], options: LayerOptions) -> None:
    """Refuse the layer options ``kind`` does not take, then the values it refuses.

    Args:
        kind: a registered layer kind.
        given: option name -> value as the command line gave it (``None`` or ``False``: not
            given).
        options: the resolved options (the kind's own check of their values:
            :meth:`GraphLayer.variant`).

    Raises:
        ConfigError: one line: ``--edge-weight applies to --model gcn only, not --model sage``
            (naming every kind that takes it), or the kind's own.
    """
    cls = layer_class(kind)
    for name, value in given.items():
        if value is None or value is False or name in cls.accepts:
            continue
        takers = kinds_with(lambda c, n=name: n in c.accepts)
        if not takers:
            raise ConfigError(f"--{name.replace('_', '-')} applies to no model kind yet")
        takers = joined(takers)
        raise ConfigError(
            f"--{name.replace('_', '-')} applies to --model {takers} only, not --model {kind}"
        )
    cls.variant(options)
