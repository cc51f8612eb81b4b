"""Family ``inputs and launch``: missing or corrupt inputs, resume mismatches, devices,
environment variables, and signals to a rank or to the launcher."""

from __future__ import annotations

from ..records import Row, Send, table

TRAIN1 = "mpirun -n 2 fullgraph {train} --epochs 1"
FOREVER = "mpirun -n 2 fullgraph {train} --epochs 100000"
RESUME = "mpirun -n 2 fullgraph {train} --epochs 6 --checkpoint ck --resume"

INPUTS_LAUNCH = table(
    "inputs and launch",
    Row(
        "mpirun -n 3 on 2 parts",
        "mpirun -n 3 fullgraph {train} --epochs 1",
        needle="2 parts but 3 ranks",
    ),
    Row("--parts missing directory", TRAIN1 + " --parts nope"),
    Row("--parts is a file", "mpirun -n 2 fullgraph train --quiet --parts logs/run.jsonl"),
    Row(
        "part file of rank 1 corrupted",
        TRAIN1,
        setup=(("flip byte", "p2/part-1/x.npy"),),
        needle="part-1",
    ),
    Row("part file truncated", TRAIN1, setup=(("truncate", "p2/part-0/indices.npy", 64),)),
    Row("part directory missing", "fullgraph verify p2", setup=(("remove", "p2/part-1"),)),
    Row("meta.json missing", TRAIN1, setup=(("remove", "p2/meta.json"),)),
    Row("unknown dataset", "fullgraph partition --dataset nope --root data --parts 2 --out q"),
    Row("--root missing", "fullgraph data info --dataset tiny --root nowhere"),
    Row("partition --parts 0", "fullgraph partition {tiny} --parts 0 --out q"),
    Row("partition --parts > nodes", "fullgraph partition {tiny} --parts 5000 --out q"),
    Row("--log-json empty", "fullgraph train --synthetic tiny --log-json ''"),
    Row("--checkpoint empty", "fullgraph train --synthetic tiny --checkpoint ''"),
    Row("--resume, other model", RESUME + " --model sage", protect=("ck",), needle="model"),
    Row(
        "--resume, other partition",
        RESUME + " --parts p2b",
        setup=(("run", "fullgraph partition {tiny} --parts 2 --out p2b --method random"),),
        protect=("ck",),
        needle="partition",
    ),
    Row(
        "--resume, no checkpoint",
        "mpirun -n 2 fullgraph {train} --epochs 6 --checkpoint empty --resume",
        check=("absent", "empty", "created an empty checkpoint dir"),
    ),
    Row("--transport nccl without GPU", TRAIN1 + " --transport nccl"),
    Row("--device cuda without GPU", "fullgraph train --synthetic tiny --device cuda"),
    Row("minibatch --fanouts 0", "fullgraph {minibatch} --fanouts 5,0"),
    Row("minibatch --batch-size 0", "fullgraph {minibatch} --batch-size 0"),
    Row(
        "FULLGRAPH_FAIL_AT malformed",
        "fullgraph train --synthetic tiny --epochs 1 --quiet",
        env={"FULLGRAPH_FAIL_AT": "0:x"},
    ),
    Row(
        "kill -9 one rank",
        FOREVER + " --checkpoint ck9 --checkpoint-every 2",
        expect="signal",
        signal=Send("SIGKILL", 7.0, "rank"),
        timeout=90,
    ),
    Row(
        "SIGTERM one rank",
        FOREVER,
        expect="signal",
        signal=Send("SIGTERM", 7.0, "rank"),
        timeout=90,
    ),
    Row(
        "SIGTERM mpirun",
        FOREVER,
        expect="signal",
        signal=Send("SIGTERM", 7.0, "main"),
        timeout=90,
    ),
    Row(
        "SIGINT one process",
        "fullgraph train --synthetic tiny --quiet --epochs 100000 --log-json l.jsonl",
        expect="signal",
        signal=Send("SIGINT", 5.0, "main"),
        timeout=90,
    ),
    Row(
        "PMI_RANK not a number",
        "fullgraph train --synthetic tiny --epochs 1",
        env={"PMI_RANK": "zero", "PMI_SIZE": "1"},
    ),
)
