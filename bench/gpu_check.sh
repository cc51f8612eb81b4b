#!/usr/bin/env bash
# The one-call GPU check for a session lent a GPU: the steps, their budgets and targets are data
# in bench/gpu_check.py (`python3 -m bench.gpu_check list`); docs/kernels.md, "GPU", lists them.
# Every step is bounded, a failing step does not stop the others, and the summary table ends the
# output and is written to OUT_DIR/gpu_check.{csv,json,md,log} (+ kernels_*.csv).
#
#   bash bench/gpu_check.sh [OUT_DIR]            OUT_DIR defaults to $OUT, else bench/results/gpu_check
#   PYTHON=...                                   the interpreter (default python3, the machine's own)
#   GPU_CHECK_DRY=1                              no GPU: the same steps on the CPU, tiny graph (CI)
#   GPU_CHECK_ONLY=spmm-products,train-gcn       only these steps (and the steps they need)
#   GPU_CHECK_WORK=DIR                           scratch space (default /tmp/fg-gpu-check)
#
# Exit status: 0 when every step ran as it should (a missed target is reported, not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/results/gpu_check}}
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu_check.sh: no interpreter '$PY' (set PYTHON)" >&2
  exit 2
fi
args=(run --out "$OUT_DIR" --python "$PY")
[[ "${GPU_CHECK_DRY:-0}" == 1 ]] && args+=(--dry)
PYTHONUNBUFFERED=1 exec "$PY" -m bench.gpu_check "${args[@]}"
