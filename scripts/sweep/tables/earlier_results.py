"""Family ``earlier results``: outputs of earlier runs, races on one output, bad option values,
divergence, a partition's ``meta.json`` that lies, a split that overlaps."""

from __future__ import annotations

from ..records import Row, Send, table

#: Seconds after the temporary output appears at which ``partition --force`` is killed.
PARTITION_KILL_AT = (0.0, 0.05, 0.2)

#: (label, command head) of the commands whose option values are tried.
VALUE_HEADS = (("train", "{train}"), ("minibatch", "{minibatch}"))

#: (option, bad value): each must be refused with one line naming the option.
BAD_VALUES = (
    ("--lr", "nan"),
    ("--lr", "inf"),
    ("--weight-decay", "nan"),
    ("--weight-decay", "-5"),
    ("--timeout", "nan"),
    ("--timeout", "0"),
    ("--timeout", "-1"),
    ("--dropout", "1.5"),
    ("--epochs", "0"),
)

#: (where, command) that read a split with a node in both train and test.
OVERLAP_READERS = (
    ("data info", "fullgraph data info {tiny}"),
    ("partition", "fullgraph partition {tiny} --parts 2 --out p2x"),
    ("verify", "fullgraph verify p2 --root data"),
)


def partition_kill_rows() -> list[Row]:
    """``partition --force`` over ``p2`` killed mid-write: ``p2`` stays whole, no debris."""
    return [
        Row(
            f"partition --force SIGKILL at {at} s",
            "fullgraph partition {arxiv} --parts 2 --out p2 --force",
            expect="signal",
            signal=Send("SIGKILL", at, "main", when=".p2.tmp-*"),
            check=("parts whole",),
            follow="fullgraph partition {tiny} --parts 2 --out p2 --force",
            timeout=180,
        )
        for at in PARTITION_KILL_AT
    ]


def bad_value_rows() -> list[Row]:
    """``CMD OPT=VAL`` for each command head and bad value (family ``option values``)."""
    return [
        Row(f"{label} {opt} {val}", f"fullgraph {head} {opt}={val}", "option values", needle=opt)
        for label, head in VALUE_HEADS
        for opt, val in BAD_VALUES
    ]


def overlap_rows() -> list[Row]:
    """A node in both train and test, seen by each of ``OVERLAP_READERS``."""
    return [
        Row(f"a node in train and test: {where}", cmd, setup=(("train node in test",),))
        for where, cmd in OVERLAP_READERS
    ]


EARLIER_RESULTS = table(
    "earlier results",
    Row(
        "train fresh on a used --checkpoint",
        "mpirun -n 2 fullgraph {train} --epochs 2 --checkpoint ck",
        protect=("ck",),
        needle="--resume",
    ),
    Row(
        "two trainings on one --checkpoint",
        "mpirun -n 2 fullgraph {train} --epochs 30 --checkpoint ck2",
        expect="one-ok",
        copies=2,
    ),
    Row(
        "two partitions to one --out",
        "fullgraph partition {tiny} --parts 2 --out p2new",
        expect="one-ok",
        copies=2,
    ),
    *partition_kill_rows(),
    Row(
        "data synth --name . --force",
        "fullgraph data synth --name . --root data --force",
        protect=("data",),
    ),
    Row(
        "data synth --name ../x",
        "fullgraph data synth --name ../x --root data",
        check=("nothing outside",),
    ),
    Row(
        "data synth --name /abs",
        "fullgraph data synth --name {w}/escaped --root data",
        check=("absent", "escaped", "wrote /abs"),
    ),
    Row(
        "--log-json onto an existing log",
        "mpirun -n 2 fullgraph {train} --epochs 2 --log-json logs/run.jsonl",
        protect=("logs",),
    ),
    Row(
        "minibatch --log-json onto an existing log",
        "fullgraph {minibatch} --log-json logs/run.jsonl",
        protect=("logs",),
    ),
    Row(
        "checkpoint with a flipped byte",
        "mpirun -n 2 fullgraph {train} --epochs 6 --checkpoint ck --resume",
        setup=(("flip byte", "ck/checkpoint.pt"),),
        protect=("ck",),
        needle="checksum",
    ),
    *bad_value_rows(),
    Row(
        "train diverges (--lr 1e30)",
        "mpirun -n 2 fullgraph {train} --epochs 30 --lr 1e30 --checkpoint ckd --checkpoint-every 1",
        expect="diverge",
        needle="loss",
    ),
    Row(
        "minibatch diverges (--lr 1e30)",
        "fullgraph {minibatch} --epochs 3 --lr 1e30",
        expect="diverge",
        needle="loss",
    ),
    Row(
        "meta.json num_train_global x10",
        "mpirun -n 2 fullgraph {train} --epochs 1",
        setup=(("scale meta", "num_train_global", 10),),
    ),
    Row(
        "verify: meta.json num_train_global x10",
        "fullgraph verify p2",
        setup=(("scale meta", "num_train_global", 10),),
    ),
    Row(
        "meta.json num_classes - 1",
        "mpirun -n 2 fullgraph {train} --epochs 1",
        setup=(("set meta", "num_classes", 3),),
    ),
    Row(
        "verify: meta.json num_classes + 5",
        "fullgraph verify p2",
        setup=(("set meta", "num_classes", 45),),
    ),
    Row(
        "meta.json num_features + 1",
        "mpirun -n 2 fullgraph {train} --epochs 1",
        setup=(("set meta", "num_features", 33),),
    ),
    Row(
        "verify: meta.json num_nodes",
        "fullgraph verify p2",
        setup=(("set meta", "num_nodes", 2999),),
    ),
    Row(
        "meta.json num_parts says 3",
        "mpirun -n 2 fullgraph {train} --epochs 1",
        setup=(("set meta", "num_parts", 3),),
    ),
    Row(
        "meta.json not JSON",
        "mpirun -n 2 fullgraph {train} --epochs 1",
        setup=(("write", "p2/meta.json", b"{not json"),),
    ),
    *overlap_rows(),
    Row(
        "--resume --epochs below the checkpoint",
        "mpirun -n 2 fullgraph {train} --epochs 2 --checkpoint ck --resume",
        protect=("ck",),
        needle="--epochs",
    ),
)
