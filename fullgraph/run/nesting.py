"""No output inside another command's output: the directories fullgraph writes as its own.

A prediction (``fullgraph predict --out``), a checkpoint directory, a partition and a dataset
``fullgraph data synth`` wrote hold their writer's files and nothing else; ``--force`` replaces
the first, third and fourth whole, and a resumed run reads the second. A log, model file,
checkpoint directory, prediction or export written into one of them would be mixed with
another run's result (and deleted with it), so :func:`check_not_inside_output` refuses it in
one line before any work, ``--force`` or not. Within one command,
:func:`fullgraph.atomic.check_apart` keeps the outputs apart from each other and from the
inputs.
"""

from __future__ import annotations

import os
from pathlib import Path

from fullgraph.atomic import OutputKind
from fullgraph.errors import ConfigError

#: How many existing directories above an output are looked at (a dataset's files lie two
#: levels down, ``NAME/raw/``; a partition's one, ``part-<r>/``).
_LEVELS = 3


def _directory_kinds() -> list[tuple[OutputKind, tuple[str, ...]]]:
    """The directory kinds with the files that mark one (imported here: each lives with its
    writer)."""
    from fullgraph.datasets.ogb_writer import DATASET
    from fullgraph.partition.output_kind import PARTITION
    from fullgraph.run.checkpoint import CHECKPOINT_DIR, CHECKPOINT_NAME, LOCK_NAME
    from fullgraph.run.prediction_dir import PREDICTION, SUMMARY

    return [
        (PREDICTION, (SUMMARY,)),
        (CHECKPOINT_DIR, (CHECKPOINT_NAME, LOCK_NAME)),
        (PARTITION, ("meta.json",)),
        (DATASET, ("meta.json",)),
    ]


def enclosing_output(path: str | os.PathLike[str]) -> tuple[Path, OutputKind] | None:
    """The directory above ``path`` that is a fullgraph output of its own (nearest first,
    :data:`_LEVELS` existing directories up), with its kind; ``None`` where there is none."""
    path = Path(os.path.abspath(path))
    kinds = _directory_kinds()
    seen = 0
    for parent in path.parents:
        if not parent.is_dir():
            continue
        seen += 1
        if seen > _LEVELS:
            break
        for kind, markers in kinds:
            if not any(os.path.lexists(parent / m) for m in markers):
                continue
            try:
                if kind.foreign(parent) is None:
                    return parent, kind
            except OSError:
                continue
    return None


def check_not_inside_output(path: str | os.PathLike[str], named: str) -> None:
    """Refuse an output inside a directory that is another fullgraph output.

    Args:
        path: the output about to be written.
        named: how the command line names it (``--save-model runs/m.pt``).

    Raises:
        ConfigError: one line naming the output, the directory and its kind.
    """
    found = enclosing_output(path)
    if found is None:
        return
    directory, kind = found
    option = named.split()[0]
    raise ConfigError(
        f"{named} is inside {directory}, {kind.noun} written by fullgraph (it holds that "
        f"output's files only); choose another {option}"
    )
