"""The package layout: no import circles, and no import from a lower floor to a higher one;
the tests named for the modules they test (:func:`naming_problems`).

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
import re
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
    "fullgraph.link_metrics",
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
    ("propagation", ("fullgraph.propagation",)),
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


#: test folder -> the package whose modules its tests are named for (the wings)
WINGS = {
    wing: f"fullgraph.{wing}"
    for wing in ("commands", "distributed", "memory", "minibatch", "models", "pyg", "run")
    + ("propagation", "training", "kernels", "partition", "datasets")
}
#: tests of the whole tree, named for what they check
TREE_TESTS = {"test_layout.py", "test_packaging.py"}
#: a feature test's docstring line naming the module(s) it enters through
ENTERS = re.compile(r"Enters through ((?::mod:`[\w.]+`(?:,? and |, )?)+)\.")


def _entered(doc: str) -> list[str]:
    found = ENTERS.search(doc)
    return re.findall(r":mod:`([\w.]+)`", found.group(1)) if found else []


def naming_problems(tests: dict[str, str], modules: set[str], beside: set[str]) -> list[str]:
    """What breaks the naming rule among ``tests`` (path under tests/ -> module docstring):
    ``tests/<wing>/test_<module>.py`` for a module (or the package) of that wing,
    ``tests/test_<module>.py`` for the ground floor (or a helper module beside the tests,
    ``beside``), ``tests/bench/test_<script>.py`` for a script of ``bench/``; any other name
    needs an ``Enters through :mod:`...`.`` line naming modules of its folder's wing. Base
    names are unique (the test folders are no packages: pytest imports each file by its name).
    """
    problems = []
    seen: dict[str, str] = {}
    for rel, doc in sorted(tests.items()):
        parts = rel.split("/")
        name = parts[-1]
        if name in seen:
            problems.append(f"tests/{rel}: the same name as tests/{seen[name]}")
        seen.setdefault(name, rel)
        stem = name.removeprefix("test_").removesuffix(".py")
        entered = _entered(doc)
        if len(parts) == 1:
            if name in TREE_TESTS or stem in beside or f"fullgraph.{stem}" in modules:
                continue
            wing = "fullgraph"
        elif parts[0] == "bench":
            if any((ROOT / "bench").glob(f"{stem}.*")):
                continue
            problems.append(f"tests/{rel}: names no script of bench/")
            continue
        elif parts[0] not in WINGS:
            problems.append(f"tests/{rel}: tests/{parts[0]} is no wing ({', '.join(WINGS)})")
            continue
        else:
            wing = WINGS[parts[0]]
            own = {m.rsplit(".", 1)[-1] for m in modules if m.startswith(wing + ".")}
            if stem in own or stem == parts[0]:
                continue
        outside = [m for m in entered if m not in modules or not m.startswith(wing + ".")]
        if not entered or outside:
            why = (
                f"names unknown or other wings' modules {outside}"
                if outside
                else (f"names no module of {wing} and has no 'Enters through :mod:`...`.' line")
            )
            problems.append(f"tests/{rel}: {why}")
    return problems


def _test_files() -> dict[str, str]:
    tests = ROOT / "tests"
    return {
        str(p.relative_to(tests)): ast.get_docstring(ast.parse(p.read_text())) or ""
        for p in tests.rglob("test_*.py")
    }


def test_every_test_file_is_named_for_its_module_or_says_where_it_enters() -> None:
    beside = {p.stem for p in (ROOT / "tests").glob("*.py")}
    assert naming_problems(_test_files(), set(_modules()), beside) == []


def test_the_naming_check_sees_a_stray_name() -> None:
    modules = {"fullgraph.errors", "fullgraph.run.epochs", "fullgraph.models.gnn"}
    ok = "Enters through :mod:`fullgraph.run.epochs`."
    got = naming_problems(
        {
            "test_errors.py": "",
            "run/test_epochs.py": "",
            "run/test_feature.py": f"A feature.\n\n{ok}",
            "run/test_stray.py": "No line.",
            "run/test_elsewhere.py": "Enters through :mod:`fullgraph.models.gnn`.",
            "models/test_epochs.py": "",
            "misc/test_gnn.py": "",
        },
        modules,
        set(),
    )
    assert got == [
        "tests/misc/test_gnn.py: tests/misc is no wing (" + ", ".join(WINGS) + ")",
        "tests/models/test_epochs.py: names no module of fullgraph.models and has no "
        "'Enters through :mod:`...`.' line",
        "tests/run/test_elsewhere.py: names unknown or other wings' modules "
        "['fullgraph.models.gnn']",
        "tests/run/test_epochs.py: the same name as tests/models/test_epochs.py",
        "tests/run/test_stray.py: names no module of fullgraph.run and has no "
        "'Enters through :mod:`...`.' line",
    ]
