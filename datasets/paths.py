"""Where a dataset lives: ``<root>/<name with - as _>/raw``, for plain names only.

Every path derived from a dataset name goes through :func:`dataset_dir`, so a name can never
reach outside its root.
"""

from __future__ import annotations

import os
from pathlib import Path

from fullgraph.atomic import Place
from fullgraph.errors import DataError

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def check_dataset_name(name: object) -> str:
    """Raise :class:`DataError` unless ``name`` is a plain dataset name, not a path.

    A plain name is non-empty, made of ASCII letters, digits, ``-``, ``_`` and ``.``, and does
    not start with ``.`` (so ``.``, ``..`` and the hidden temporaries of atomic writes are out)
    or ``-`` (``--dataset -x`` would read as an option).

    Args:
        name: the dataset name as given (``--name``, ``--dataset``, ``load(name, ...)``).

    Returns:
        ``name``.

    Raises:
        DataError: one line naming the name and what a name may hold.
    """
    if not isinstance(name, str):
        raise DataError(f"dataset name must be a string, got {type(name).__name__} {name!r}")
    allowed = "must be a plain name (letters, digits, '-', '_', '.')"
    if not name:
        raise DataError("dataset name is empty; give a plain name (letters, digits, '-', '_', '.')")
    if "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise DataError(f"dataset name {name!r} {allowed}, not a path")
    if name.startswith((".", "-")):
        raise DataError(
            f"dataset name {name!r} {allowed} that does not start with {name[0]!r}"
            + (" (a command line would take it for an option)" if name[0] == "-" else "")
        )
    bad = sorted(set(name) - _NAME_CHARS)
    if bad:
        raise DataError(f"dataset name {name!r} {allowed}; it holds {''.join(bad)!r}")
    return name


#: dataset -> its directory names: ours, then the one it is distributed under (MUSAE's)
DIRECTORIES = {"facebook": ("facebook", "facebook_page_page"), "github": ("github", "github_musae")}


def dataset_dir(root: str | Path, name: str) -> Path:
    """``<root>/<name with - as _>`` (OGB's own directory rule), for a plain ``name`` only.

    Every path derived from a dataset name goes through here, so a name can never reach
    outside ``root`` (see :func:`check_dataset_name`).

    Raises:
        DataError: ``name`` is empty, a path (``/``, ``\\``, ``.``, ``..``), starts with ``.``
            or holds other characters than letters, digits, ``-``, ``_`` and ``.``.
    """
    return Path(root) / check_dataset_name(name).replace("-", "_")


def raw_dir(root: str | Path, name: str) -> Path:
    """``<root>/<name with - as _>/raw``, checked to be a directory.

    Raises:
        DataError: the root, the dataset directory or its ``raw/`` is missing or not a
            directory; the message says which and what to put there.
    """
    d = dataset_dir(root, name)
    root = Path(root)
    if not root.is_dir():
        what = "does not exist" if not os.path.lexists(root) else "is not a directory"
        raise DataError(f"dataset root {root} {what}; give the directory that holds {d.name}/")
    if not d.is_dir():
        if os.path.lexists(d):
            raise DataError(f"dataset {name!r}: {d} is a file; expected a directory there")
        raise DataError(f"dataset {name!r} not found: expected directory {d}")
    raw = d / "raw"
    if not raw.is_dir():
        what = "is not a directory" if os.path.lexists(raw) else "is missing"
        raise DataError(f"{raw} {what}; the dataset's files go in {raw}/")
    return raw


def dataset_inputs(name: str, root: str | Path) -> list[Place]:
    """What a command that loads dataset ``name`` from ``root`` reads, for
    :func:`fullgraph.atomic.check_apart`: the dataset's directory (no output there or inside
    it) and the root (no output there; outputs beside the dataset are fine).

    Raises:
        DataError: ``name`` is not a plain name (see :func:`check_dataset_name`).
    """
    d = dataset_dir(root, name)
    # a dataset read from any of its directories: none of them may take an output
    names = next((n for n in DIRECTORIES.values() if d.name in n), (d.name,))
    dirs = [d, *(Path(root) / n for n in names if n != d.name)]
    return [
        Place(Path(root), f"--root {root}", "the dataset root", inside_ok=True),
        *(Place(p, f"--dataset {name} --root {root}", "the dataset directory") for p in dirs),
    ]
