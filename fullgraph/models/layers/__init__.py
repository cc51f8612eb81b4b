"""The layer kinds of the full-batch models, behind one small registry.

A layer kind is one class deriving from :class:`GraphLayer` in one module of this package,
registered with :func:`register_layer` under its name (``gcn``, ``sage``): it says which
aggregation operator it needs (:meth:`GraphLayer.operator`, built once per rank from the part's
local CSR) and computes its output from its input and the rank's
:class:`~fullgraph.models.context.GraphContext`. A new kind is one new file here: the modules
of this package are found and imported when a kind is first looked up.
"""

from __future__ import annotations

import importlib
import pkgutil

from fullgraph.errors import ConfigError
from fullgraph.models.layers.base import LAYERS, GraphLayer, LayerOptions, register_layer

__all__ = ["GraphLayer", "LayerOptions", "layer_class", "layer_kinds", "register_layer"]


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
