"""The package layout: no import circles, and a ground floor that imports nothing above it.

The import graph is read from the source (every ``import`` and ``from ... import``, including
those inside functions), over the four packages of the distribution. The ground floor
(:data:`GROUND`) holds what everything may use: errors, atomic writes, resource probes, the
counter hashes, the configuration framework and the process watchdog.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: package name -> its directory (pyproject's package-dir)
PACKAGES = {
    "fullgraph": ROOT / "fullgraph",
    "fullgraph.kernels": ROOT / "kernels",
    "fullgraph.partition": ROOT / "partition",
    "fullgraph.datasets": ROOT / "datasets",
}
GROUND = {
    "fullgraph.errors",
    "fullgraph.atomic",
    "fullgraph.resources",
    "fullgraph.hashing",
    "fullgraph.config",
    "fullgraph.watchdog",
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            rel = path.relative_to(directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a ``from`` of a submodule names it)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("fullgraph"):
                    graph[name].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    graph = import_graph()
    assert _cycles(graph) == []


def test_ground_floor_imports_nothing_above_it() -> None:
    graph = import_graph()
    for module in GROUND:
        above = graph[module] - GROUND
        assert not above, f"{module} imports {sorted(above)}"


def test_the_wings_exist_and_the_runtime_floor_is_small() -> None:
    """The folders tell the architecture: the runtime's top floor holds only the ground floor
    and the command line."""
    top = {p.stem for p in PACKAGES["fullgraph"].glob("*.py")} - {"__init__"}
    assert top == {m.split(".")[1] for m in GROUND} | {"cli"}
    for wing in ("distributed", "models", "training", "minibatch"):
        assert (PACKAGES["fullgraph"] / wing / "__init__.py").is_file()


def test_the_checker_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
