"""Family ``clear errors``: a rendezvous nobody answers, an edgeless graph, MUSAE's own names,
a full disk."""

from __future__ import annotations

from ..records import Row, table

#: (what is being written, options that write it into the full tmpfs ``full``).
FULL_DISK_WRITES = (
    ("checkpoint", "--checkpoint full/ck --checkpoint-every 1"),
    ("log", "--log-json full/run.jsonl"),
)

#: torchrun's variables of rank 1 of 2 whose rank 0 (port 9) never answers.
NOBODY_ANSWERS = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "9",
}


def full_disk_rows() -> list[Row]:
    """A full disk while writing each of ``FULL_DISK_WRITES`` (root and ``mount`` only)."""
    return [
        Row(
            f"full disk while writing the {what}",
            f"fullgraph train --synthetic tiny --quiet --epochs 3 {opts}",
            setup=(("full tmpfs", "full"),),
            check=("unmount", "full"),
            needle="no space left on device",
            code=1,
            timeout=60,
            needs=("root", "mount"),
        )
        for what, opts in FULL_DISK_WRITES
    ]


CLEAR_ERRORS = table(
    "clear errors",
    Row(
        "gloo rendezvous at an address nobody answers",
        "fullgraph {train} --epochs 1 --transport gloo --timeout 10",
        env=NOBODY_ANSWERS,
        needle="127.0.0.1",
        code=4,
        timeout=60,
    ),
    Row(
        "npz: a graph with no edges",
        "fullgraph data info --dataset amazon-photo --root data",
        expect="ok",
        setup=(("npz no edges",),),
    ),
    Row(
        "MUSAE under its own directory name",
        "fullgraph data info --dataset github --root data",
        expect="ok",
        setup=(("musae copy",),),
    ),
    *full_disk_rows(),
)
