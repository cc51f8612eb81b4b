"""The package layout: no import circles, and no import from a lower floor to a higher one.

The import graph is read from the source (every ``import`` and ``from ... import``, including
those inside functions), over the four packages of the distribution. The ground floor
(:data:`GROUND`) holds what everything may use: errors, atomic writes and the renames they are
made of, resource probes, the counter hashes, the configuration framework, the process
watchdog, the metrics and the ``--precision`` option with its device check.
:data:`FLOORS` orders the rest: a module may import its own floor and the floors below it,
never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: package name -> its directory (setup.py's ROOTS)
PACKAGES = {
    "fullgraph": ROOT / "fullgraph",
    "fullgraph.kernels": ROOT / "kernels",
    "fullgraph.partition": ROOT / "partition",
    "fullgraph.datasets": ROOT / "datasets",
}
GROUND = {
    "fullgraph.errors",
    "fullgraph.atomic",
    "fullgraph.renames",
    "fullgraph.resources",
    "fullgraph.hashing",
    "fullgraph.config",
    "fullgraph.watchdog",
    "fullgraph.metrics",
    "fullgraph.precision",
}

#: The floors, lowest first: (name, module prefixes). A module belongs to the floor of the
#: longest prefix it starts with.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", tuple(sorted(GROUND))),
    ("data and kernels", ("fullgraph.datasets", "fullgraph.partition", "fullgraph.kernels")),
    ("distributed", ("fullgraph.distributed",)),
    ("models", ("fullgraph.models",)),
    ("run", ("fullgraph.run",)),
    ("trainers", ("fullgraph.training", "fullgraph.minibatch")),
    ("memory", ("fullgraph.memory",)),
    ("entry points", ("fullgraph.pyg", "fullgraph.commands", "fullgraph.cli", "fullgraph")),
]


def floor_of(module: str) -> int:
    """The index in :data:`FLOORS` of ``module``'s floor (the longest matching prefix)."""
    best, length = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    assert best >= 0, f"{module} is on no floor"
    return best


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


def test_no_module_imports_a_higher_floor() -> None:
    graph = import_graph()
    up = [
        f"{m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0]})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if floor_of(t) > floor_of(m)
    ]
    assert up == []


def test_the_floor_checker_sees_an_upward_import() -> None:
    assert floor_of("fullgraph.run.epochs") < floor_of("fullgraph.training.trainer")
    assert floor_of("fullgraph.errors") == 0
    assert floor_of("fullgraph") == len(FLOORS) - 1


def test_the_wings_exist_and_the_runtime_floor_is_small() -> None:
    """The folders tell the architecture: the runtime's top floor holds only the ground floor
    and the command line."""
    top = {p.stem for p in PACKAGES["fullgraph"].glob("*.py")} - {"__init__"}
    assert top == {m.split(".")[1] for m in GROUND} | {"cli"}
    for wing in ("distributed", "models", "run", "training", "minibatch", "memory", "commands"):
        assert (PACKAGES["fullgraph"] / wing / "__init__.py").is_file()


def test_the_checker_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
