"""What a test compares before and after a command that must touch nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree(*roots: Path) -> dict[str, str | None]:
    """Every path under ``roots`` (hidden ones too) with its sha256 (``None`` for directories)."""
    return {
        str(p): None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for root in roots
        for p in sorted(root.rglob("*"))
    }
