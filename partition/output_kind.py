"""A partition directory as an output: what ``fullgraph partition --force`` may replace
(:data:`PARTITION`: only a directory :func:`~fullgraph.partition.build.write_partitions`
wrote, with the hops training precomputed on it) and the check of ``--out``."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fullgraph.atomic import OutputKind, holds, is_plain_dir, is_plain_file, read_marker
from fullgraph.partition.format import BLOCK_ARRAYS, EDGE_ARRAYS, META_NAME, PART_ARRAYS

__all__ = ["PARTITION", "PRECOMPUTE_DIR", "check_partition_out"]

_PART_DIR = re.compile(r"part-\d+")
#: The folder of SGC's and SIGN's hops kept with the partition
#: (:mod:`fullgraph.propagation.cache`); replaced with the partition.
PRECOMPUTE_DIR = "precompute"


def _not_a_partition(path: Path) -> str | None:
    """``None`` when ``path`` is a partition directory :func:`write_partitions` wrote (or an
    empty directory), else what makes it someone else's.

    Ours: a ``meta.json`` with the partition format's fields (``format_version``,
    ``num_parts``, ``files``; any version) and ``part-<r>/`` directories of ``.npy`` files that
    ``meta.json`` lists (or that the format names), and the hops training precomputed on it
    (:data:`PRECOMPUTE_DIR`), nothing else.
    """
    if not path.is_dir():
        return "it is a file" if path.is_file() else "it is not a directory"
    meta = read_marker(path / META_NAME)
    if not (isinstance(meta, dict) and {"format_version", "num_parts", "files"} <= set(meta)):
        meta = None
    files = meta["files"] if meta is not None and isinstance(meta["files"], dict) else {}
    unexpected: list[Path] = []
    entries = sorted(path.iterdir())
    for entry in entries:
        if entry.name == META_NAME and meta is not None:
            continue
        if _PART_DIR.fullmatch(entry.name) and is_plain_dir(entry):
            for f in entry.iterdir():
                listed = f"{entry.name}/{f.name}" in files or (
                    f.suffix == ".npy"
                    and (f.stem in PART_ARRAYS or f.stem in EDGE_ARRAYS or f.stem in BLOCK_ARRAYS)
                )
                if not (listed and is_plain_file(f)):
                    unexpected.append(f)
            continue
        if entry.name == PRECOMPUTE_DIR and is_plain_dir(entry):
            continue
        unexpected.append(entry)
    reason = holds(path, unexpected)
    if reason is None and meta is None and entries:
        reason = f"it has no {META_NAME} of a partition"
    return reason


#: A partition directory: ``--force`` replaces only one that :func:`write_partitions` wrote.
PARTITION = OutputKind("a partition", _not_a_partition)


def check_partition_out(
    out: str | os.PathLike[str], force: bool, option: str | None = None
) -> None:
    """Refuse ``out`` unless it is new, or a partition fullgraph wrote and ``force`` is given.

    Raises:
        ConfigError: ``out`` holds something else than a partition fullgraph wrote.
        FileExistsError: ``out`` exists and ``force`` is false.
    """
    PARTITION.check_replaceable(out, option)
    if os.path.lexists(out) and not force:
        named = f"{option} {out}" if option else str(out)
        raise FileExistsError(f"{named} already exists (use --force to replace it)")
