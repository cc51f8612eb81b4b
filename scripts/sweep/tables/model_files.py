"""Family ``model files`` (issue 31's Lost and Debris): ``--save-model`` and ``--checkpoint``
pointed at another fullgraph file or output, concurrent writers of one model file, and a full
disk while predict maps its rows or a checkpoint run starts."""

from __future__ import annotations

from ..records import Row, table

MODEL = "logs/run.model.pt"
EXPORT = "fullgraph export --model " + MODEL + " --to pyg exported.py"
PREDICT = "fullgraph predict {tiny} --model " + MODEL + " --out pred"
SAVE = "mpirun -n 2 fullgraph {train} --epochs 1 --save-model "

#: (what, the path --save-model points at, setup steps making it, the needle).
TARGETS = (
    ("onto another run's checkpoint", "ck/checkpoint.pt", (), "checkpoint"),
    ("onto export weights", "exported.pt", (("run", EXPORT),), "export"),
    ("onto a log", "logs/run.jsonl", (), "run.jsonl"),
    ("into a predict output dir", "pred/model.pt", (("run", PREDICT),), "pred"),
)


def save_model_rows() -> list[Row]:
    """``train --save-model`` onto each of ``TARGETS``, without and with ``--force``."""
    return [
        Row(
            f"train --save-model {what}{force}",
            SAVE + path + force,
            setup=steps,
            protect=(path,),
            needle=needle,
        )
        for what, path, steps, needle in TARGETS
        for force in ("", " --force")
    ]


MODEL_FILES = table(
    "model files",
    *save_model_rows(),
    Row(
        "two trainings to one --save-model",
        "fullgraph train --synthetic tiny --quiet --epochs 300 --save-model same.model.pt",
        expect="one-ok",
        copies=2,
        timeout=240,
    ),
    Row(
        "train --checkpoint onto a predict output dir --force",
        "mpirun -n 2 fullgraph {train} --epochs 1 --checkpoint pred --force",
        setup=(("run", PREDICT),),
        protect=("pred",),
        needle="pred",
    ),
    Row(
        "predict on a full disk",
        "fullgraph predict {tiny} --model " + MODEL + " --out full/pred",
        setup=(("full tmpfs", "full"),),
        check=("unmount", "full"),
        needle="no space left on device",
        code=1,
        timeout=60,
        needs=("root", "mount"),
    ),
    Row(
        "train --checkpoint on a full disk",
        "fullgraph train --synthetic tiny --quiet --epochs 3 --checkpoint full/ck",
        setup=(("full tmpfs", "full"),),
        check=("unmount", "full"),
        needle="no space left on device",
        code=1,
        timeout=60,
        needs=("root", "mount"),
    ),
)
