"""The record of one rule of :func:`fullgraph.pyg.distribute` (:class:`Rule`: the classes it
matches, its treatment, its handler), the state of one conversion, and the one-line refusal
(:func:`refuse`) every handler raises."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fullgraph.errors import ConfigError
from fullgraph.pyg.part_data import PartGraph

#: Why a whole-graph normalisation is refused.
WHOLE_GRAPH = "its statistics are taken over all nodes of a graph at once"


@dataclass
class Conversion:
    """The state of one :func:`~fullgraph.pyg.distribute` call: the part and the attention
    layers so far."""

    part: PartGraph
    gat_count: int = 0


#: A rule's handler: called with the module's path, the module and the conversion, it returns
#: the twin, ``True`` (keep, look at the children) or ``False`` (keep as it is), and raises
#: :class:`~fullgraph.errors.ConfigError` to refuse. The module is of the rule's own classes
#: (``GCNConv`` for ``gcn``, ...): one type per rule, which one ``Callable`` type cannot name.
Handler = Callable[[str, Any, Conversion], "nn.Module | bool"]


@dataclass(frozen=True)
class Rule:
    """How :func:`~fullgraph.pyg.distribute` treats the modules one rule matches.

    Attributes:
        classes: dotted names of the classes matched (resolved on first use; a name the
            installed torch or PyG lacks matches nothing).
        treatment: ``twin``, ``kept``, ``walked`` or ``refused`` (for the docs).
        notes: the supported options and what is refused, or why the module is refused.
        handle: the handler (:data:`Handler`).
        exact: match the classes themselves, not their subclasses.
        prefix: match instead every class defined in a module whose name starts with this
            (a rule without classes and prefix matches every module).
        label: the docs' name of what is matched (default: the class names).
    """

    classes: tuple[str, ...]
    treatment: str
    notes: str
    handle: Handler
    exact: bool = True
    prefix: str = ""
    label: str = ""
    _resolved: list[tuple[type, ...]] = field(default_factory=list, compare=False, repr=False)

    def types(self) -> tuple[type, ...]:
        """The classes of :attr:`classes` (imported once)."""
        if not self._resolved:
            found = []
            for name in self.classes:
                module, _, attr = name.rpartition(".")
                try:
                    found.append(getattr(importlib.import_module(module), attr))
                except (ImportError, AttributeError):
                    pass
            self._resolved.append(tuple(found))
        return self._resolved[0]

    def matches(self, module: nn.Module) -> bool:
        """Whether this rule treats ``module``."""
        cls = type(module)
        if self.prefix or not self.classes:
            return cls.__module__.startswith(self.prefix)
        if self.exact:
            return cls in self.types()
        return isinstance(module, self.types())

    def row(self) -> str:
        """The rule as a row of the docs' table."""
        what = self.label or ", ".join(f"`{c}`" for c in self.classes)
        return f"| {what} | {self.treatment} | {self.notes} |"


def refuse(path: str, module: nn.Module, why: str) -> ConfigError:
    """The line refusing ``module`` at ``path``: its path, class and why."""
    cls = type(module)
    return ConfigError(
        f"{path} ({cls.__module__}.{cls.__qualname__}) cannot be distributed exactly: {why}"
    )


def check(path: str, module: nn.Module, checks: tuple[tuple[str, bool], ...], why: str) -> None:
    """Refuse ``module`` for the first ``(what, bad)`` of ``checks`` that is bad."""
    for what, bad in checks:
        if bad:
            raise refuse(path, module, f"{what} {why}")
