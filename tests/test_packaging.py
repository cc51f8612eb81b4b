"""The distribution as a user installs it: an sdist, the wheel built from it, run without the tree.

An editable install (what ``make install`` and CI use) imports the source folders directly and
hides a package missing from the wheel, so this builds the sdist of the checkout, the wheel from
that sdist (``pip wheel``: what ``pip install .`` and an index ship), installs the wheel into a
folder of its own and runs the commands from a directory outside the tree, with that folder
first on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: import root -> folder in the tree (setup.py's ROOTS).
ROOTS = {
    "fullgraph": "fullgraph",
    "fullgraph/kernels": "kernels",
    "fullgraph/partition": "partition",
    "fullgraph/datasets": "datasets",
}


def _tree_packages() -> dict[str, str]:
    """Every package folder of the tree: its path in the wheel (``fullgraph/kernels``) -> its
    path in the tree and the sdist (``kernels``)."""
    found = {}
    for name, folder in ROOTS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).as_posix()
            tail = "" if rel == "." else f"/{rel}"
            found[f"{name}{tail}"] = f"{folder}{tail}"
    return found


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run ``cmd``; its output, or the test fails with it."""
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (cmd, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(the sdist, the wheel, an environment whose path starts at the installed wheel)."""
    work = tmp_path_factory.mktemp("packaging")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    # the sdist from a copy of the tracked files (building in place would write build/ and
    # *.egg-info into the checkout)
    src = work / "src"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        path = ROOT / os.fsdecode(name)
        if path.is_file():
            (src / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            (src / os.fsdecode(name)).write_bytes(path.read_bytes())
    dist = work / "dist"
    build = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(dist)]
    _run([*build, str(src)], work, env)
    (sdist,) = dist.glob("fullgraph-*.tar.gz")
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*wheel_cmd, "-w", str(dist), str(sdist)], work, env)
    (wheel,) = dist.glob("fullgraph-*.whl")
    site = work / "site"
    pip_install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile"]
    _run([*pip_install, "--target", str(site), str(wheel)], work, env)
    env["PYTHONPATH"] = str(site)
    env["PATH"] = f"{site / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return sdist, wheel, env


def test_the_wheel_holds_every_package_of_the_tree(installed) -> None:
    """Each folder with an ``__init__.py`` is in the wheel (and so in the sdist it came from)."""
    sdist, wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        in_wheel = {Path(n).parent.as_posix() for n in z.namelist() if n.endswith("__init__.py")}
    packages = _tree_packages()
    assert set(packages) - in_wheel == set()
    with tarfile.open(sdist) as t:  # fullgraph-0.1.0/kernels/__init__.py -> kernels
        in_sdist = {Path(*Path(n).parts[1:]).parent.as_posix() for n in t.getnames()}
    assert set(packages.values()) - in_sdist == set()


@pytest.mark.timeout(900)
def test_the_installed_wheel_runs_outside_the_tree(installed, tmp_path: Path) -> None:
    """``fullgraph --help``, ``fullgraph train --help`` and a tiny training, from the wheel."""
    _, _, env = installed
    site = Path(env["PYTHONPATH"])
    where = _run(
        [
            sys.executable,
            "-c",
            "import fullgraph.commands, fullgraph.cli; print(fullgraph.__file__)",
        ],
        tmp_path,
        env,
    )
    assert Path(where.strip()).is_relative_to(site), where
    assert "train" in _run(["fullgraph", "--help"], tmp_path, env)
    assert "--model" in _run(["fullgraph", "train", "--help"], tmp_path, env)
    out = _run(
        ["fullgraph", "train", "--synthetic", "tiny", "--epochs", "2", "--hidden", "8"],
        tmp_path,
        {**env, "OMP_NUM_THREADS": "1"},
    )
    assert "test" in out, out
