#!/usr/bin/env bash
# 2 nodes x 2 ranks give the one-process losses: `fullgraph train` and `fullgraph minibatch`,
# over mpi (mpirun + netns-exec.sh) and gloo (torchrun), on a cluster of scripts/netns-cluster.sh.
#
# Usage (root, the venv's bin first on PATH):
#   bash scripts/netns-exact.sh [--prefix fgn] [--subnet 10.77.0] [WORKDIR]
# Brings up a 2-node cluster of that prefix if it is not up (and takes it down again), makes a
# tiny synthetic graph and its 4-part partition in WORKDIR (default: a temporary directory),
# prints the largest relative loss difference per command and transport and the launch
# information each run recorded; exit 1 when a difference exceeds 1e-5.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=fgn subnet=10.77.0
while [[ ${1:-} == --prefix || ${1:-} == --subnet ]]; do
    [[ $1 == --prefix ]] && prefix=$2 || subnet=$2
    shift 2
done
work=${1:-$(mktemp -d)}
mkdir -p "$work"
cd "$work"
made=0
if [[ ! -f /run/netns-cluster/$prefix/hostfile ]]; then
    bash "$HERE/netns-cluster.sh" up 2 --rate 10gbit --prefix "$prefix" --subnet "$subnet" >/dev/null
    made=1
fi
trap '((made)) && bash "$HERE/netns-cluster.sh" down --prefix "$prefix" >/dev/null' EXIT
hosts=/run/netns-cluster/$prefix/hostfile
L="$HERE/netns-launch.sh"

fullgraph data synth --preset tiny --name tiny --root data --seed 0 --force >/dev/null
fullgraph partition --dataset tiny --root data --parts 4 --out p4 --force >/dev/null
T=(train --epochs 5 --quiet --timeout 60 --force)
M=(minibatch --dataset tiny --root data --epochs 2 --fanouts 5,3 --batch-size 128 --quiet
    --timeout 60 --force)
fullgraph "${T[@]}" --dataset tiny --root data --threads 1 --log-json train-1.jsonl >/dev/null
fullgraph "${M[@]}" --threads 1 --log-json mb-1.jsonl >/dev/null
"$L" mpirun -f "$hosts" -n 4 -- fullgraph "${T[@]}" --parts p4 --transport mpi \
    --log-json train-mpi.jsonl >/dev/null
"$L" torchrun -f "$hosts" -n 4 --port 29541 -- fullgraph "${T[@]}" --parts p4 \
    --transport gloo --log-json train-gloo.jsonl >/dev/null 2>&1
"$L" mpirun -f "$hosts" -n 4 -- fullgraph "${M[@]}" --transport mpi --log-json mb-mpi.jsonl \
    >/dev/null
"$L" torchrun -f "$hosts" -n 4 --port 29543 -- fullgraph "${M[@]}" --transport gloo \
    --log-json mb-gloo.jsonl >/dev/null 2>&1
python3 - <<'PY'
import json
import sys


def load(path):
    return [json.loads(line) for line in open(path)]


worst = 0.0
for kind, name in (("train", "train"), ("mb", "minibatch")):
    ref = [r["loss"] for r in load(f"{kind}-1.jsonl") if "loss" in r]
    for t in ("mpi", "gloo"):
        got = [r["loss"] for r in load(f"{kind}-{t}.jsonl") if "loss" in r]
        cfg = json.load(open(f"{kind}-{t}.config.json"))
        err = max(abs(a - b) / abs(b) for a, b in zip(got, ref, strict=True))
        worst = max(worst, err)
        launch = cfg["launch"]
        print(f"{name:9} {t:4}: {len(got)} epochs, largest relative loss difference {err:.1e}; "
              f"{launch['launcher']}, {launch['size']} ranks, {launch['local_size']} per node, "
              f"{cfg['threads_per_rank']} thread(s) per rank")
sys.exit(1 if worst > 1e-5 else 0)
PY
