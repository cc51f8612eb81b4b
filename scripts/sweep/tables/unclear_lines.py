"""Family ``unclear lines`` (issue 31): errors that were refused but named the wrong thing. A
non-finite value must name the damaged file and its line; an absurd ``--edge-dim`` must get
``data synth``'s own advice (not train's ``--memory-check``); a model trained with edge weights
on a graph without them must name the data; a damaged halo map under ``--no-verify`` must be a
line, not an ``IndexError``; options that look like other things (``-1`` fan-outs, a name that
starts with ``-``, ``.`` as an output) must be read as the user meant them."""

from __future__ import annotations

from ..records import Row, table

#: A weighted copy of ``tiny`` with 3-wide edge features (``tw``).
WEIGHTED = (
    "run",
    "fullgraph data synth --preset tiny --name tw --root data --edge-weight --edge-dim 3",
)
RAW = "data/tw/raw/"
NPZ_TRAIN = "fullgraph train --dataset amazon-photo --root data --quiet --epochs 1"
MODEL = "logs/run.model.pt"

#: (what, the damaged file, its line 5 rewritten as, train's extra options).
BAD_GZ_VALUES = (
    ("NaN", "edge_weight.csv.gz", "nan", "--edge-weight"),
    ("1e308", "edge_weight.csv.gz", "1e308", "--edge-weight"),
    ("-inf", "edge_feat.csv.gz", "0.5,-inf,0.25", ""),
    ("3.5e38", "edge_feat.csv.gz", "0.5,0.5,3.5e38", ""),
    ("NaN", "node-feat.csv.gz", ",".join(["nan"] * 32), ""),
)

#: (what, npz key, index, value) in the gnn-benchmark ``.npz`` (stored as float64).
BAD_NPZ_VALUES = (
    ("an edge value of 1e308", "adj_data", 3, 1e308),
    ("a NaN feature", "attr_data", 1, float("nan")),
)

#: (what, the damaged halo file, index, value) run with ``--no-verify`` at two ranks.
BAD_HALO = (
    ("a send index past the part", "p2/part-1/send_index.npy", 7, 10**7),
    ("a negative send index", "p2/part-0/send_index.npy", 2, -3),
)


def value_rows() -> list[Row]:
    """train (and ``data info``) on each of ``BAD_GZ_VALUES`` and ``BAD_NPZ_VALUES``."""
    rows = []
    for what, name, line, opts in BAD_GZ_VALUES:
        setup = (WEIGHTED, ("gz set line", RAW + name, 4, line))
        rows += [
            Row(
                f"train {opts} on {what} in {name}".replace("  ", " "),
                f"fullgraph train --dataset tw --root data --quiet --epochs 1 {opts}",
                setup=setup,
                needle=f"{name}: line 5",
                timeout=90,
            ),
            Row(
                f"data info on {what} in {name}",
                "fullgraph data info --dataset tw --root data",
                setup=setup,
                needle=f"{name}: line 5",
                timeout=90,
            ),
        ]
    for what, key, index, value in BAD_NPZ_VALUES:
        rows.append(
            Row(
                f"npz: train on {what}",
                NPZ_TRAIN + (" --edge-weight" if key == "adj_data" else ""),
                setup=(("npz set", key, index, value, "float64"),),
                needle=f"{key}[{index}]",
                timeout=90,
            )
        )
    return rows


def halo_rows() -> list[Row]:
    """train and predict at two ranks, ``--no-verify``, on each of ``BAD_HALO``."""
    rows = []
    for what, rel, index, value in BAD_HALO:
        step = ("npy set", rel, index, value)
        rows += [
            Row(
                f"train --no-verify with {what}",
                "mpirun -n 2 fullgraph {train} --epochs 1 --no-verify",
                setup=(step,),
                needle=f"entry {index} sends node {value}",
                timeout=90,
            ),
            Row(
                f"predict --no-verify with {what}",
                f"mpirun -n 2 fullgraph predict --parts p2 --model {MODEL} --out pred --no-verify",
                setup=(step,),
                needle=f"entry {index} sends node {value}",
                check=("absent", "pred", "an output was written"),
                timeout=90,
            ),
        ]
    return rows


#: Three parts of ``tiny``; part 2 then expects one row more from part 0, one fewer from part 1.
THREE_PARTS = ("run", "fullgraph partition {tiny} --parts 3 --out p3")
SHIFTED_RECV = (("npy add", "p3/part-2/recv_offsets.npy", 1, 1),)

UNCLEAR_LINES = table(
    "unclear lines",
    *value_rows(),
    *halo_rows(),
    Row(
        "train --no-verify at 3 ranks with halo counts that disagree across parts",
        "mpirun -n 3 fullgraph train --parts p3 --quiet --epochs 1 --no-verify",
        setup=(THREE_PARTS, *SHIFTED_RECV),
        needle="halo maps disagree",
        timeout=120,
    ),
    Row(
        "data synth --edge-dim 10**8",
        "fullgraph data synth --preset tiny --name wide --root data --edge-dim 100000000",
        needle="ask for --edge-dim",
        check=("absent", "data/wide", "a dataset was written"),
        timeout=60,
    ),
    Row(
        "data synth --edge-dim 4*10**6 on arxiv",
        "fullgraph data synth --preset arxiv --name wide --root data --edge-dim 4000000",
        needle="ask for --edge-dim",
        check=("absent", "data/wide", "a dataset was written"),
        timeout=60,
    ),
    Row(
        "predict --dataset of a weighted model on a graph without weights",
        f"fullgraph predict {{tiny}} --model {MODEL} --out pred",
        setup=(("set value", MODEL, "config.edge_weight", True),),
        needle="tiny",
        check=("absent", "pred", "an output was written"),
        timeout=90,
    ),
    Row(
        "train --dataset --edge-weight on a graph without weights",
        "fullgraph train {tiny} --quiet --epochs 1 --edge-weight",
        needle="tiny",
        timeout=90,
    ),
    Row(
        "minibatch --fanouts -1,4 (all neighbours, then 4)",
        "fullgraph {minibatch} --fanouts -1,4",
        expect="ok",
        timeout=120,
    ),
    Row(
        "data synth --name=-y",
        "fullgraph data synth --preset tiny --name=-y --root data",
        needle="'-y'",
        check=("absent", "data/-y", "a dataset was written"),
        timeout=60,
    ),
    Row(
        "partition --out .",
        "fullgraph partition {tiny} --parts 2 --out .",
        needle="--out .",
        protect=("data", "p2"),
        timeout=60,
    ),
    Row(
        "predict --out ./",
        f"fullgraph predict {{tiny}} --model {MODEL} --out ./",
        needle="--out",
        protect=("data", MODEL),
        timeout=60,
    ),
    Row(
        "train --log-json ./",
        "fullgraph train --synthetic tiny --quiet --epochs 1 --log-json ./",
        needle="--log-json",
        timeout=60,
    ),
    Row(
        "verify of a part with a negative halo count",
        "fullgraph verify p2",
        setup=(("set part meta", 1, "num_halo", -4),),
        needle="parts[1].num_halo is -4",
        timeout=60,
    ),
)
