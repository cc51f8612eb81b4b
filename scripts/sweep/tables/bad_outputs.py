"""Family ``bad outputs``: outputs in bad places (a directory, under a file, read-only)."""

from __future__ import annotations

from ..records import Row, table

#: (option, path, what the path is) given to ``train``.
TRAIN_OUTPUTS = (
    ("--log-json", "logs", "a directory"),
    ("--log-json", "p2/meta.json/x.jsonl", "under a file"),
    ("--log-json", "/proc/fg/x.jsonl", "read-only place"),
    ("--checkpoint", "/proc/fg/ck", "read-only place"),
    ("--checkpoint", "p2/meta.json", "a file"),
)


def train_output_rows() -> list[Row]:
    """``train OPT PATH`` for each of ``TRAIN_OUTPUTS``: refused, nothing written."""
    return [
        Row(
            f"train {opt} {kind}",
            f"mpirun -n 2 fullgraph {{train}} --epochs 1 {opt} {rel}",
            protect=("p2", "logs"),
            check=("only config", "logs/run.config.json"),
        )
        for opt, rel, kind in TRAIN_OUTPUTS
    ]


BAD_OUTPUTS = table(
    "bad outputs",
    *train_output_rows(),
    Row(
        "minibatch --log-json a directory",
        "fullgraph {minibatch} --log-json logs",
        protect=("logs",),
    ),
    Row("partition --out read-only place", "fullgraph partition {tiny} --parts 2 --out /proc/fg/p"),
    Row(
        "partition --out under a file",
        "fullgraph partition {tiny} --parts 2 --out p2/meta.json/p",
        protect=("p2",),
    ),
    Row(
        "data synth --root is a file",
        "fullgraph data synth --name t --root p2/meta.json",
        protect=("p2",),
    ),
    Row("verify parts/meta.json", "fullgraph verify p2/meta.json", expect="ok"),
    Row(
        "train --parts parts/meta.json",
        "mpirun -n 2 fullgraph train --quiet --epochs 1 --parts p2/meta.json",
        expect="ok",
    ),
)
