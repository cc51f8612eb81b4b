"""Family ``debris``: a writer stopped mid-write leaves no temporaries (or the next run
removes them)."""

from __future__ import annotations

from ..records import Row, Send, table

DEBRIS = table(
    "debris",
    Row(
        "partition SIGTERM",
        "fullgraph partition {arxiv} --parts 2 --out pbig",
        expect="signal",
        signal=Send("SIGTERM", 0.05, "main", when=".pbig.tmp-*"),
        timeout=180,
    ),
    Row(
        "partition SIGKILL, next run cleans",
        "fullgraph partition {arxiv} --parts 2 --out pbig",
        expect="signal",
        signal=Send("SIGKILL", 0.05, "main", when=".pbig.tmp-*"),
        follow="fullgraph partition {tiny} --parts 2 --out pbig",
        timeout=180,
    ),
    Row(
        "data synth SIGTERM",
        "fullgraph data synth --preset arxiv --name a2 --root data",
        expect="signal",
        signal=Send("SIGTERM", 0.05, "main", when="data/.a2.tmp-*"),
        timeout=180,
    ),
    Row(
        "train SIGKILL mid-checkpointing, next run cleans",
        "fullgraph train --synthetic tiny --quiet --epochs 100000 --checkpoint cks"
        " --checkpoint-every 1",
        expect="signal",
        signal=Send("SIGKILL", 6.0, "main"),
        follow="fullgraph train --synthetic tiny --quiet --epochs 1 --checkpoint cks --force",
        timeout=200,
    ),
)
