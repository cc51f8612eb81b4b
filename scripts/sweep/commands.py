"""The launchers and the placeholders of a case's command template."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
FULLGRAPH = [sys.executable, "-m", "fullgraph.cli"]
MPIRUN = str(BIN / "mpirun") if (BIN / "mpirun").exists() else "mpirun"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

#: Words of a template that stand for several arguments (a launcher, a common command head).
WORDS: dict[str, list[str]] = {
    "fullgraph": FULLGRAPH,
    "mpirun": [MPIRUN],
    "python": [sys.executable],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "{train}": ["train", "--parts", "p2", "--quiet"],
    "{minibatch}": "minibatch --dataset tiny --root data --quiet --epochs 1".split(),
    "{tiny}": ["--dataset", "tiny", "--root", "data"],
    "{arxiv}": ["--dataset", "arxiv", "--root", "big"],
}


def argv(template: str) -> list[str]:
    """The argument list of a command template: shell words, each of ``WORDS`` expanded.

    ``{w}`` (the case dir) stays as it is; the runner fills it in.
    """
    out: list[str] = []
    for word in shlex.split(template):
        if word.startswith("{") and word.endswith("}") and word not in WORDS and word != "{w}":
            raise ValueError(f"unknown placeholder {word} in {template!r}")
        out += WORDS.get(word, [word])
    return out


def fg(*args: str) -> list[str]:
    """``fullgraph ARGS`` in this Python."""
    return [*FULLGRAPH, *args]


def mpi(ranks: int, *args: str) -> list[str]:
    """``mpirun -n RANKS fullgraph ARGS``."""
    return [MPIRUN, "-n", str(ranks), *FULLGRAPH, *args]
