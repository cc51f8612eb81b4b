"""Family ``force`` (the second sweep): ``--force`` pointed at what fullgraph did not write or
at an input of the same command, and outputs that overlap; each must end with one line and
touch nothing."""

from __future__ import annotations

from ..records import Row, table

PARTITION_FORCE = "fullgraph partition {tiny} --parts 2 --out {out} --force"
THESIS = b"\\documentclass{article}\n"

#: Where the log goes while the checkpoint is ``ck``: inside it, or inside ``--parts``.
OVERLAPPING_LOGS = ("ck/config.json", "ck/checkpoint.pt", "ck", "p2/run.jsonl")


def _partition_to(out: str) -> str:
    """``fullgraph partition`` of the tiny dataset into ``out`` with ``--force``."""
    return PARTITION_FORCE.replace("{out}", out)


def overlapping_log_rows() -> list[Row]:
    """``train --log-json LOG --checkpoint ck`` for each of ``OVERLAPPING_LOGS``."""
    return [
        Row(
            f"train --log-json {log} with --checkpoint ck",
            f"mpirun -n 2 fullgraph {{train}} --epochs 1 --checkpoint ck --resume --log-json {log}",
            protect=("ck", "p2"),
        )
        for log in OVERLAPPING_LOGS
    ]


FORCE = table(
    "force",
    Row(
        "partition --force --out the dataset read",
        _partition_to("data/tiny"),
        protect=("data",),
        needle="dataset",
    ),
    Row(
        "partition --force --out the dataset root",
        _partition_to("data"),
        setup=(("write", "data/notes.txt", b"my notes\n"),),
        protect=("data",),
        needle="root",
    ),
    Row(
        "partition --force --out a folder of two partitions",
        _partition_to("two"),
        setup=(("copy", "p2", "two/a"), ("copy", "p2", "two/b")),
        protect=("two",),
        needle="not a partition",
    ),
    Row(
        "partition --force --out a user folder",
        _partition_to("user"),
        setup=(("write", "user/thesis.tex", THESIS),),
        protect=("user",),
        needle="thesis.tex",
    ),
    Row(
        "data synth --force over a user folder",
        "fullgraph data synth --preset tiny --name mine --root r --force",
        setup=(("write", "r/mine/thesis.tex", THESIS),),
        protect=("r",),
        needle="thesis.tex",
    ),
    *overlapping_log_rows(),
    Row(
        "train --force --log-json a user's notes",
        "mpirun -n 2 fullgraph {train} --epochs 1 --force --log-json notes.jsonl",
        setup=(("write", "notes.jsonl", b'{"my": "notes"}\n'),),
        protect=("notes.jsonl",),
        needle="notes.jsonl",
    ),
)

#: Runs last in the sweep (after the other second-sweep families), as it always has.
FORCE_CONTROL = table(
    "force",
    Row(
        "train --force over its own log and checkpoint (control)",
        "mpirun -n 2 fullgraph {train} --epochs 1 --force --checkpoint ck"
        " --log-json logs/run.jsonl",
        expect="ok",
    ),
)
