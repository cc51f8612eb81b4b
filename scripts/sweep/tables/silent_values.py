"""Family ``silent values`` (issue 31): bad values that were accepted with exit 0. A model file
or checkpoint with a NaN, an infinity, another dtype or shape (rewritten with a valid checksum,
as a buggy or diverged run would write it); edge weights under which GCN's ``D^-1/2`` is not
defined; a warm-up that outlasts the run; a resume that changes the learning-rate schedule;
an absurd depth; non-finite float options. Each must be refused in one line, exit 2, before
any work, leaving the files it read as they were."""

from __future__ import annotations

from ..records import Row, table

MODEL = "logs/run.model.pt"
CHECKPOINT = "ck/checkpoint.pt"
PREDICT = "fullgraph predict {tiny} --model " + MODEL + " --out pred"
PREDICT_P2 = "mpirun -n 2 fullgraph predict --parts p2 --model " + MODEL + " --out pred"
EXPORT = "fullgraph export --model " + MODEL + " --to pyg exported.py"
RESUME = "mpirun -n 2 fullgraph {train} --checkpoint ck --resume --epochs 5"

#: (what, setup step on the model file, text of the line) for predict and export.
BAD_MODELS = (
    (
        "one NaN weight",
        ("set tensor", MODEL, "state_dict.layers.1.lin.weight", float("nan")),
        "1 NaN",
    ),
    ("one inf bias", ("set tensor", MODEL, "state_dict.layers.0.lin.bias", float("inf")), "1 inf"),
    ("-inf weight", ("set tensor", MODEL, "state_dict.layers.0.lin.weight", -float("inf")), "inf"),
    ("int64 weights", ("retype tensor", MODEL, "state_dict.layers.0.lin.weight", "int64"), "int64"),
    (
        "float64 bias",
        ("retype tensor", MODEL, "state_dict.layers.1.lin.bias", "float64"),
        "float64",
    ),
    ("a bias cut short", ("cut tensor", MODEL, "state_dict.layers.1.lin.bias"), "shape"),
)

#: (what, setup step on the checkpoint, text of the line) for --resume.
BAD_CHECKPOINTS = (
    (
        "NaN in Adam's second moment",
        ("set tensor", CHECKPOINT, "optimizer.exp_avg_sq.2", float("nan")),
        "exp_avg_sq.2",
    ),
    (
        "inf in Adam's first moment",
        ("set tensor", CHECKPOINT, "optimizer.exp_avg.0", float("inf")),
        "1 inf",
    ),
    (
        "a NaN learning rate in the optimiser",
        ("set value", CHECKPOINT, "optimizer.lr", float("nan")),
        "'lr' is nan",
    ),
    (
        "a NaN weight",
        ("set tensor", CHECKPOINT, "model.layers.1.lin.weight", float("nan")),
        "1 NaN",
    ),
    (
        "float16 weights",
        ("retype tensor", CHECKPOINT, "model.layers.0.lin.weight", "float16"),
        "float16",
    ),
)

#: A weighted copy of ``tiny`` (``tw``), its weights then changed by ``steps``.
WEIGHTED = ("run", "fullgraph data synth --preset tiny --name tw --root data --edge-weight")
WEIGHTS = "data/tw/raw/edge_weight.csv.gz"
PARTITION_TW = ("run", "fullgraph partition --dataset tw --root data --parts 2 --out pw")
#: The workspace's model file, marked as trained with --edge-weight.
WEIGHTED_MODEL = ("set value", MODEL, "config.edge_weight", True)
NO_PREDICTION = ("absent", "pred", "an output was written")
#: (what, steps on the weights, options) for train --edge-weight.
BAD_WEIGHTS = (
    ("all negated", (("gz scale", WEIGHTS, -1.0),), ""),
    ("all -1", (("gz fill", WEIGHTS, "-1"),), ""),
    ("all -1.5 with --improved", (("gz fill", WEIGHTS, "-1.5"),), "--improved"),
)

#: Options refused as they are (one line, exit 2).
BAD_OPTIONS = (
    (
        "--lr-warmup 500 (200 epochs)",
        "fullgraph train --synthetic tiny --quiet --lr-warmup 500",
        "--lr-warmup 500",
    ),
    (
        "--lr-warmup equal to --epochs",
        "fullgraph train --synthetic tiny --quiet --epochs 5 --lr-warmup 5",
        "--epochs 5",
    ),
    (
        "--lr-warmup 10**23",
        "fullgraph train --synthetic tiny --quiet --lr-warmup 100000000000000000000000",
        "--lr-warmup",
    ),
    (
        "--lr-warmup 1e23",
        "fullgraph train --synthetic tiny --quiet --lr-warmup 1e23",
        "--lr-warmup",
    ),
    (
        "cosine --lr-warmup past the run",
        "fullgraph train --synthetic tiny --quiet --epochs 3 --lr-schedule cosine --lr-warmup 7",
        "--lr-warmup 7",
    ),
    (
        "--layers 100000 at width 16",
        "fullgraph train --synthetic tiny --quiet --layers 100000 --hidden 16",
        "--layers 100000",
    ),
    ("--layers 5000 over 2 ranks", "mpirun -n 2 fullgraph {train} --layers 5000", "--layers 5000"),
    ("plan --layers 100000", "fullgraph plan --parts p2 --layers 100000", "--layers 100000"),
    ("--lr nan", "fullgraph train --synthetic tiny --quiet --lr nan", "--lr"),
    ("--lr -inf", "fullgraph train --synthetic tiny --quiet --lr=-inf", "--lr"),
    (
        "--weight-decay inf",
        "fullgraph train --synthetic tiny --quiet --weight-decay inf",
        "--weight-decay",
    ),
    ("--dropout nan", "fullgraph train --synthetic tiny --quiet --dropout nan", "--dropout"),
    ("--timeout nan", "fullgraph train --synthetic tiny --quiet --timeout nan", "--timeout"),
    (
        "--exchange-buffer-mb inf",
        "fullgraph train --synthetic tiny --quiet --exchange-buffer-mb inf",
        "--exchange-buffer-mb",
    ),
    ("minibatch --weight-decay inf", "fullgraph {minibatch} --weight-decay inf", "--weight-decay"),
    ("plan --node-memory nan", "fullgraph plan --parts p2 --node-memory nan", "--node-memory"),
)

#: (what, the resumed run's options, text of the line): another schedule than the checkpoint's
#: (``ck``: 3 epochs, constant, no warm-up; ``cos``: 4 epochs under cosine, warm-up 1).
CHANGED_SCHEDULES = (
    ("another --lr-warmup", "--checkpoint ck --epochs 5 --lr-warmup 1", "lr_warmup=0"),
    (
        "--lr-schedule cosine onto a constant run",
        "--checkpoint ck --epochs 5 --lr-schedule cosine",
        "lr_schedule",
    ),
    (
        "a longer cosine schedule",
        "--checkpoint cos --epochs 9 --lr-schedule cosine --lr-warmup 1",
        "epochs=4",
    ),
    (
        "a cosine run as constant",
        "--checkpoint cos --epochs 6 --lr-warmup 1",
        "lr_schedule='cosine'",
    ),
    (
        "--edge-weight onto an unweighted run",
        "--checkpoint ck --epochs 5 --edge-weight",
        "edge_weight",
    ),
)
COSINE_RUN = (
    "run",
    "mpirun -n 2 fullgraph {train} --epochs 4 --checkpoint cos --checkpoint-every 2 "
    "--lr-schedule cosine --lr-warmup 1",
)


def model_rows() -> list[Row]:
    """predict (one process and two ranks) and export of each of ``BAD_MODELS``."""
    rows = []
    for what, step, needle in BAD_MODELS:
        for cmd, who, out in (
            (PREDICT, "predict", "pred"),
            (PREDICT_P2, "predict at 2 ranks", "pred"),
            (EXPORT, "export", "exported.py"),
        ):
            rows.append(
                Row(
                    f"{who} of a model file with {what}",
                    cmd,
                    setup=(step,),
                    needle=needle,
                    protect=(MODEL,),
                    check=("absent", out, "an output was written"),
                    timeout=90,
                )
            )
    return rows


def checkpoint_rows() -> list[Row]:
    """``--resume`` from each of ``BAD_CHECKPOINTS``."""
    return [
        Row(
            f"--resume from a checkpoint with {what}",
            RESUME,
            setup=(step,),
            needle=needle,
            protect=("ck",),
            timeout=90,
        )
        for what, step, needle in BAD_CHECKPOINTS
    ]


def weight_rows() -> list[Row]:
    """train (whole graph and two parts) and predict of a weighted model, on each of
    ``BAD_WEIGHTS``."""
    rows = []
    for what, steps, opts in BAD_WEIGHTS:
        setup = (WEIGHTED, *steps)
        needle = "D^-1/2 is not defined"
        rows += [
            Row(
                f"train --edge-weight {opts} with edge weights {what}",
                f"fullgraph train --dataset tw --root data --quiet --edge-weight {opts}",
                setup=setup,
                needle=needle,
                protect=("data/tw/raw",),
                timeout=90,
            ),
            Row(
                f"train --edge-weight {opts} at 2 ranks with edge weights {what}",
                f"mpirun -n 2 fullgraph train --parts pw --quiet --edge-weight {opts}",
                setup=(*setup, PARTITION_TW),
                needle=needle,
                protect=("pw",),
                timeout=120,
            ),
            Row(
                f"plan --edge-weight {opts} of a partition with edge weights {what}",
                f"fullgraph plan --parts pw --edge-weight {opts}",
                setup=(*setup, PARTITION_TW),
                needle=needle,
                protect=("pw",),
                timeout=90,
            ),
        ]
    rows.append(
        Row(
            "predict of a weighted GCN on all-negative edge weights",
            f"fullgraph predict --dataset tw --root data --model {MODEL} --out pred",
            setup=(WEIGHTED, ("gz scale", WEIGHTS, -1.0), WEIGHTED_MODEL),
            needle="D^-1/2 is not defined",
            check=NO_PREDICTION,
            timeout=90,
        )
    )
    return rows


def option_rows() -> list[Row]:
    """``BAD_OPTIONS`` and ``CHANGED_SCHEDULES``."""
    rows = [Row(what, cmd, needle=needle, timeout=90) for what, cmd, needle in BAD_OPTIONS]
    rows += [
        Row(
            f"--resume with {what}",
            f"mpirun -n 2 fullgraph {{train}} --resume {opts}",
            setup=(COSINE_RUN,),
            needle=needle,
            protect=("ck", "cos"),
            timeout=120,
        )
        for what, opts, needle in CHANGED_SCHEDULES
    ]
    return rows


SILENT_VALUES = table(
    "silent values", *model_rows(), *checkpoint_rows(), *weight_rows(), *option_rows()
)
