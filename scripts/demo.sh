#!/usr/bin/env bash
# The fullgraph demo: synthetic graph -> METIS partition into 2 parts -> verify -> 2-rank training
# -> 2-rank prediction of every node with the best-validation model.
# Usage: bash scripts/demo.sh [OUTDIR]   (make demo puts the venv's bin first on PATH)
# Idempotent: a rerun regenerates the (small) data and partition and retrains, replacing the
# demo's own outputs with --force (which replaces only what fullgraph wrote).
# MPIRUN overrides the launcher; Open MPI gets --allow-run-as-root --oversubscribe.
set -euo pipefail

OUT=${1:-runs/demo}
DATA="$OUT/data"
PARTS="$OUT/parts/tiny-synth-2"
LOG="$OUT/train.jsonl"
MODEL="$OUT/train.model.pt"
PRED="$OUT/predictions"
MPIRUN=${MPIRUN:-mpirun}
MPI_FLAGS=()
if "$MPIRUN" --version 2>/dev/null | grep -q "Open MPI"; then
    MPI_FLAGS=(--allow-run-as-root --oversubscribe)
fi
mkdir -p "$OUT"

echo "== 1/5 synthetic graph (preset tiny) -> $DATA"
fullgraph data synth --preset tiny --name tiny-synth --root "$DATA" --seed 0 --force

echo "== 2/5 METIS partition into 2 parts -> $PARTS"
fullgraph partition --dataset tiny-synth --root "$DATA" --parts 2 --method metis \
    --out "$PARTS" --force

echo "== 3/5 verify the partition against the source graph"
fullgraph verify "$PARTS" --root "$DATA"

echo "== 4/5 train: $MPIRUN -n 2 fullgraph train (GCN, 2 layers, hidden 64, 100 epochs)"
"$MPIRUN" "${MPI_FLAGS[@]}" -n 2 fullgraph train --parts "$PARTS" --model gcn --layers 2 \
    --hidden 64 --dropout 0.5 --lr 0.01 --weight-decay 5e-4 --epochs 100 --seed 0 \
    --transport mpi --eval-every 5 --log-json "$LOG" --checkpoint "$OUT/checkpoint" \
    --checkpoint-every 50 --force

python - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
final = rows[-1]
epochs = [r for r in rows if not r.get("final")]
steady = [r for r in epochs if not r.get("startup")]  # the first epoch carries the start-up
per_epoch = statistics.median(r["comm_bytes"] for r in epochs)
# the median epoch, and the slowest rank's own split of it (its parts add up to it)
mid = sorted(steady, key=lambda r: r["epoch_s"])[(len(steady) - 1) // 2]
ms = lambda key: mid[key] * 1e3
print("== summary")
print(f"  accuracy: best val {final['best_val_acc']:.4f}, test at best val {final['test_acc']:.4f}"
      f" (epoch {final['best_epoch']}), {final['ranks']} ranks over {final['transport']}")
print(f"  median epoch (epoch {mid['epoch']}): {ms('epoch_s'):.1f} ms = slowest rank "
      f"{mid['slowest_rank']}'s compute {ms('slowest_compute_s'):.1f} + halo exchange "
      f"{ms('slowest_comm_s'):.1f} + gradient all-reduce {ms('slowest_reduce_s'):.1f} ms")
print(f"  start-up: epoch {final['startup_epoch']} took {final['startup_epoch_s']:.2f} s"
      f" (left out of the median)")
print(f"  bytes exchanged: {per_epoch / 1e3:.1f} kB per epoch (all ranks), "
      f"{sum(r['comm_bytes'] for r in epochs) / 1e6:.2f} MB in {len(epochs)} epochs; "
      f"peak memory per rank {max(r['peak_rss_mb'] for r in epochs):.0f} MB")
PY

echo "== 5/5 predict: $MPIRUN -n 2 fullgraph predict (the best-validation model, every node)"
"$MPIRUN" "${MPI_FLAGS[@]}" -n 2 fullgraph predict --parts "$PARTS" --model "$MODEL" \
    --out "$PRED" --embeddings 1 --transport mpi --force

python - "$PRED" "$MODEL" <<'PY'
import json, sys
import numpy as np
out, model = sys.argv[1], sys.argv[2]
summary = json.load(open(f"{out}/predict.json"))
pred = np.load(f"{out}/predictions.npy", mmap_mode="r")
prob = np.load(f"{out}/probabilities.npy", mmap_mode="r")
print(f"== predictions in {out}/: predictions.npy {pred.shape}, probabilities.npy {prob.shape}, "
      f"embeddings-1.npy, predict.json")
print(f"  {json.dumps(summary.get('summary', {}))}")
print(f"  open them with numpy.load(path, mmap_mode='r'); the model: "
      f"torch.load({model!r}, weights_only=True)")
PY
