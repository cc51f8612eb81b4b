"""Family ``minibatch`` (issue 31 item 4): the baseline's new options (``--save-model``,
``--progress-every``) given what fullgraph did not write or cannot use, and ``fullgraph plan``
of a mini-batch or a ``--dataset`` run given bad sizes, sources or option order; each must end
with one line and touch nothing. Controls: a model file replaced with ``--force``, a plan that
fits."""

from __future__ import annotations

from ..records import Row, table

THESIS = b"\\documentclass{article}\n"
PLAN_MB = "fullgraph plan minibatch --dataset tiny --root data"


def _save_model_rows() -> list[Row]:
    """``minibatch --save-model`` onto what is not a model file fullgraph wrote."""
    onto = [
        ("a training log", "logs/run.jsonl", (), "logs/run.jsonl"),
        ("a checkpoint", "ck/checkpoint.pt", (), "ck"),
        ("a run's config", "logs/run.config.json", (), "logs"),
        ("a user's file", "thesis.tex", (("write", "thesis.tex", THESIS),), "thesis.tex"),
        ("a part file", "p2/part-0/x.npy", (), "p2"),
        ("the dataset's meta.json", "data/tiny/meta.json", (), "data"),
    ]
    rows = []
    for what, path, setup, protect in onto:
        for force in ("", " --force"):
            rows.append(
                Row(
                    f"minibatch --save-model onto {what}{force}",
                    f"fullgraph {{minibatch}} --save-model {path}{force}",
                    setup=setup,
                    protect=(protect,),
                    needle="--save-model",
                )
            )
    return rows


MINIBATCH = table(
    "minibatch",
    *_save_model_rows(),
    Row(
        "minibatch --save-model onto an existing model without --force",
        "fullgraph {minibatch} --save-model logs/run.model.pt",
        protect=("logs",),
        needle="--force",
    ),
    Row(
        "minibatch --save-model a directory",
        "fullgraph {minibatch} --save-model logs",
        protect=("logs",),
        needle="--save-model",
    ),
    Row(
        "minibatch --save-model under a file",
        "fullgraph {minibatch} --save-model thesis.tex/model.pt",
        setup=(("write", "thesis.tex", THESIS),),
        protect=("thesis.tex",),
        needle="--save-model",
    ),
    Row(
        "minibatch --save-model the --log-json path",
        "fullgraph {minibatch} --save-model m.jsonl --log-json m.jsonl",
        check=("absent", "m.jsonl", "a log or model written"),
        needle="one path",
    ),
    Row("minibatch --save-model empty", "fullgraph {minibatch} --save-model ''", needle="value"),
    Row(
        "minibatch --progress-every -1",
        "fullgraph {minibatch} --progress-every -1",
        needle="--progress-every",
    ),
    Row(
        "minibatch --progress-every nan",
        "fullgraph {minibatch} --progress-every nan",
        needle="--progress-every",
    ),
    Row(
        "minibatch --progress-every a word",
        "fullgraph {minibatch} --progress-every often",
        needle="--progress-every",
    ),
    Row(
        "minibatch --save-model over a model file --force (control)",
        "fullgraph {minibatch} --save-model logs/run.model.pt --force",
        expect="ok",
    ),
    # fullgraph plan minibatch
    Row("plan minibatch --fanouts 5,0", f"{PLAN_MB} --fanouts 5,0", needle="--fanouts"),
    Row("plan minibatch --fanouts 5,x", f"{PLAN_MB} --fanouts 5,x", needle="--fanouts"),
    Row("plan minibatch --fanouts empty", f"{PLAN_MB} --fanouts ''", needle="--fanouts"),
    Row("plan minibatch --fanouts -2,5", f"{PLAN_MB} --fanouts -2,5", needle="--fanouts"),
    Row("plan minibatch --ranks 0", f"{PLAN_MB} --ranks 0", needle="--ranks"),
    Row("plan minibatch --ranks 1.5", f"{PLAN_MB} --ranks 1.5", needle="--ranks"),
    Row("plan minibatch --batch-size 0", f"{PLAN_MB} --batch-size 0", needle="--batch-size"),
    Row(
        "plan minibatch --hidden 10000000",
        f"{PLAN_MB} --hidden 10000000 --floor-mb 1",
        needle="does not fit",
    ),
    Row(
        "plan minibatch --node-memory 0",
        f"{PLAN_MB} --node-memory 0",
        needle="--node-memory",
    ),
    Row(
        "plan minibatch of a missing dataset",
        "fullgraph plan minibatch --dataset nope --root data",
        needle="nope",
    ),
    Row(
        "plan minibatch without --dataset",
        "fullgraph plan minibatch --root data",
        needle="--dataset",
    ),
    Row(
        "plan minibatch with the options before it",
        "fullgraph plan --hidden 64 minibatch --dataset tiny --root data",
        needle="before",
    ),
    Row(
        "plan minibatch --parts (not its option)",
        f"{PLAN_MB} --parts p2",
        needle="--parts",
    ),
    # fullgraph plan --dataset
    Row(
        "plan --dataset without --root",
        "fullgraph plan --dataset tiny --model sage",
        needle="--root",
    ),
    Row(
        "plan --dataset and --parts",
        "fullgraph plan --dataset tiny --root data --parts p2 --model sage",
        needle="exactly one",
    ),
    Row(
        "plan --dataset missing",
        "fullgraph plan --dataset nope --root data --model sage",
        needle="nope",
    ),
    Row(
        "plan --dataset --split of a dataset without splits",
        "fullgraph plan --dataset tiny --root data --split 3 --model sage",
        needle="--split",
    ),
    Row(
        "plan --dataset --hidden 10000000",
        "fullgraph plan --dataset tiny --root data --model sage --hidden 10000000",
        needle="does not fit",
    ),
    Row(
        "plan minibatch that fits (control)",
        f"{PLAN_MB} --ranks 2 --fanouts 5,5 --floor-mb 1",
        expect="ok",
    ),
)
