"""Families ``sizes`` (sizes beyond the node's memory are refused before anything large is
allocated) and ``out of memory`` (an allocation that fails: one line, exit status 1)."""

from __future__ import annotations

from ..records import Row, Send, table

ONE = "fullgraph train --synthetic tiny --quiet --epochs 1"

#: Options whose memory plan is beyond the node's memory.
TOO_BIG = (
    "--hidden 10000000",
    "--model gat --heads 100000",
    "--layers 1000 --hidden 4096",  # deeper is refused as such (table silent values)
)


def too_big_rows() -> list[Row]:
    """``train OPTS`` for each of ``TOO_BIG``: refused by the memory plan."""
    return [
        Row(f"train {opts}", f"{ONE} {opts}", needle="memory plan", timeout=60) for opts in TOO_BIG
    ]


SIZES = table(
    "sizes",
    *too_big_rows(),
    Row(
        "train --layers 1000 (fits at width 16), SIGTERM at 5 s",
        ONE + " --layers 1000 --epochs 100",
        expect="signal",
        signal=Send("SIGTERM", 5.0, "main"),
        timeout=30,
    ),
    Row(
        "mpirun -n 2 train beyond the node's memory",
        "mpirun -n 2 fullgraph {train} --epochs 1 --hidden 1000000",
        needle="memory plan",
        timeout=60,
    ),
    Row(
        "minibatch --hidden 10000000",
        "fullgraph {minibatch} --hidden 10000000",
        needle="memory plan",
        timeout=60,
    ),
)

#: Past the plan (``--memory-check warn``) under a 6 GB address space limit, so that the
#: machine is not emptied.
OUT_OF_MEMORY = table(
    "out of memory",
    Row(
        "train out of memory (--memory-check warn)",
        "prlimit --as=6000000000 fullgraph train --quiet --epochs 1 --hidden 10000000"
        " --memory-check warn --synthetic tiny",
        needle="out of memory",
        code=1,
        timeout=120,
        needs=("prlimit",),
    ),
)
