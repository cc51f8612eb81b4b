"""The packages of the distribution, found in the tree rather than listed.

One distribution, four import roots mapped from the top-level folders our users asked for
(``package-dir`` in pyproject.toml): ``fullgraph/`` -> ``fullgraph``, ``kernels/`` ->
``fullgraph.kernels``, ``partition/`` -> ``fullgraph.partition``, ``datasets/`` ->
``fullgraph.datasets``. Every folder with an ``__init__.py`` below a root is a package of the
wheel, so a new wing cannot be left out (``tests/test_packaging.py`` builds the wheel).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
#: import name -> folder, as pyproject.toml's ``package-dir`` says.
ROOTS = {
    "fullgraph": "fullgraph",
    "fullgraph.kernels": "kernels",
    "fullgraph.partition": "partition",
    "fullgraph.datasets": "datasets",
}


def packages() -> list[str]:
    """Every package below the roots, under its import name."""
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]
    return sorted(set(found))


setup(packages=packages(), package_dir=ROOTS)
