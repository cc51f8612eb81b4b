"""``fullgraph predict``'s small helpers beside :mod:`fullgraph.commands.predict`: the run's
canonical command line (``predict.json``'s ``command``), what Correct & Smooth's outputs are,
the start line's note of a ``--nodes`` selection, and the check that every rank sees the
directory rank 0 writes."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullgraph.config import Config
from fullgraph.errors import ConfigError

if TYPE_CHECKING:
    from fullgraph.training.node_selection import NodeRows

#: What ``probabilities.npy`` holds under ``--correct-smooth`` (``predict.json`` says it).
PROBABILITIES_SMOOTHED = (
    "Correct & Smooth's class scores in [0, 1] (rows need not sum to 1; predictions.npy is "
    "their argmax), not the model's softmax"
)


def command_line(ranks: int, *configs: Config) -> str:
    """The run's command line, canonical: the options that differ from their defaults."""
    argv = ["fullgraph", "predict"]
    for cfg in configs:
        for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
            if not f.metadata.get("cli", True):
                continue
            value = getattr(cfg, f.name)
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if value == default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag)
            elif isinstance(value, list):
                argv += [flag, ",".join(str(v) for v in value)]
            else:
                argv += [flag, str(value)]
    line = shlex.join(argv)
    return f"mpirun -n {ranks} {line}" if ranks > 1 else line


def describe_smoothing(params: dict[str, Any]) -> str:
    """C&S's parameters in one line (``correction 50 steps, alpha 1, scale 20; ...``)."""
    scale = params["scale"]
    scale = scale if isinstance(scale, str) else f"{scale:g}"
    return (
        f"correction {params['correction_layers']} steps, alpha {params['correction_alpha']:g}, "
        f"scale {scale}; smoothing {params['smoothing_layers']} steps, alpha "
        f"{params['smoothing_alpha']:g}; the predictions and probabilities.npy are the "
        f"smoothed ones"
    )


def check_visible(directory: Path, out: Path) -> None:
    """Every rank writes into ``directory``: refuse a rank that does not see it.

    Raises:
        ConfigError: this rank does not see it.
    """
    if not directory.is_dir():
        raise ConfigError(
            f"--out {out}: this rank does not see {directory.parent}, where rank 0 writes; "
            f"every rank writes its rows there, so give a directory on a file system all ranks "
            f"share"
        )


def writing_note(selected: NodeRows | None, spec: str) -> str:
    """The start line's note of a ``--nodes`` selection (``, writing 140 (--nodes train)``),
    or ``""`` for every node."""
    return "" if selected is None else f", writing {selected.count} (--nodes {spec})"
