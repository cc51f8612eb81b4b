"""Family ``bounded phases``: start-up stalls and dead launchers; every rank ends within
``--timeout`` (+ slack)."""

from __future__ import annotations

from ..records import Row, Send, table

#: The training that would run forever; ``--timeout 15`` bounds each phase.
FOREVER = "{train} --epochs 100000 --timeout 15 --log-json l.jsonl"

#: Seconds after the start at which one rank is stopped.
STOP_AT = (0.5, 2.5)

#: A ``fullgraph.pyg`` script whose rank 1 fails before it calls ``load_part``.
PYG_FAILS_EARLY = b"""import os, sys
from fullgraph import pyg
if os.environ.get("PMI_RANK") == "1":
    raise ValueError("the script failed on rank 1")
pyg.load_part(sys.argv[1], timeout=10.0)
"""


def stop_rows() -> list[Row]:
    """One rank stopped (SIGSTOP) at each of ``STOP_AT``."""
    return [
        Row(
            f"SIGSTOP one rank at {at} s (--timeout 15)",
            "mpirun -n 2 fullgraph " + FOREVER,
            expect="signal",
            signal=Send("SIGSTOP", at, "rank"),
            timeout=90,
        )
        for at in STOP_AT
    ]


BOUNDED_PHASES = table(
    "bounded phases",
    *stop_rows(),
    Row(
        "pyg: rank 1 raises before load_part",
        "mpirun -n 2 python script.py p2",
        expect="fails",
        setup=(("write", "script.py", PYG_FAILS_EARLY),),
        needle="rank 1",
        timeout=90,
    ),
    Row(
        "kill -9 torchrun",
        "torchrun --standalone --nproc-per-node 2 -m fullgraph.cli " + FOREVER,
        expect="signal",
        signal=Send("SIGKILL", 1.0, "main", when="l.jsonl"),
        timeout=90,
    ),
    Row(
        "SIGTERM one process during start-up",
        "fullgraph train {arxiv} --epochs 1 --quiet",
        expect="signal",
        signal=Send("SIGTERM", 1.0, "main"),
        timeout=60,
    ),
)
