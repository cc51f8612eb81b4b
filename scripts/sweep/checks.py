"""The vocabulary of checks after a case: each returns a problem or ``None``.

A problem naming ``not whole`` or ``wrote`` counts as ``lost``, any other as ``debris``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from .commands import ENV, fg
from .records import Step

Check = Callable[[Path], str | None]


def _parts_whole() -> Check:
    """``fullgraph verify p2`` still passes."""

    def check(w: Path) -> str | None:
        proc = subprocess.run(fg("verify", "p2"), cwd=w, env=ENV, capture_output=True, text=True)
        return (
            None if proc.returncode == 0 else f"p2 not whole after the case: {proc.stderr.strip()}"
        )

    return check


def _nothing_outside() -> Check:
    """Nothing named ``x`` or ``escaped`` beside the case dir."""

    def check(w: Path) -> str | None:
        strays = [p.name for p in w.parent.iterdir() if p.name in ("x", "escaped")]
        return f"wrote outside --root: {strays}" if strays else None

    return check


def _absent(rel: str, problem: str) -> Check:
    """``problem`` if ``rel`` exists."""
    return lambda w: problem if (w / rel).exists() else None


def _only_config(rel: str) -> Check:
    """No ``*.config.json`` but ``rel``."""
    return lambda w: "stray config file" if list(w.glob("**/*.config.json")) != [w / rel] else None


def _unmount(rel: str) -> Check:
    """Unmounts the tmpfs of ``full tmpfs`` (never a problem)."""

    def check(w: Path) -> str | None:
        subprocess.run(["umount", str(w / rel)], check=False)
        return None

    return check


#: verb -> function of the check's arguments that makes the check.
CHECKS: dict[str, Callable[..., Check]] = {
    "parts whole": _parts_whole,
    "nothing outside": _nothing_outside,
    "absent": _absent,  # rel, problem
    "only config": _only_config,  # rel
    "unmount": _unmount,  # rel
}


def check(step: Step | None) -> Check | None:
    """The check a row names (``None`` for none)."""
    if step is None:
        return None
    verb, *args = step
    return CHECKS[verb](*args)
