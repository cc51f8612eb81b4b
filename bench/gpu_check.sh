#!/usr/bin/env bash
# Kernel checks for a session lent a GPU (about 3-5 minutes on an H200):
#   1. the kernel tests natively on CUDA (Triton compiled, not interpreted),
#   2. an arxiv-like graph generated here (`fullgraph data synth --preset arxiv`),
#   3. bench/kernels.py --device cuda at F=128: ours (Triton) vs torch.sparse.mm (cuSPARSE),
#      printing the ratios and the fraction of HBM bandwidth (targets: >= 1.0x, >= 50%),
#   4. `fullgraph train --device cuda`: 10 epochs of the 3-layer GCN, its median epoch time.
# Usage: bash bench/gpu_check.sh [OUT_DIR]      (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/results}}
mkdir -p "$OUT_DIR"
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then PY=.venv/bin/python
else PY=python3; fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv || true
"$PY" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
if ! "$PY" -c "import fullgraph.kernels" 2>/dev/null; then
  echo "installing fullgraph (editable, no dependencies) into $PY"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . || "$PY" -m pip install -q --no-deps -e .
fi
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q pytest pytest-timeout

echo "== 1. kernel tests on CUDA"
FULLGRAPH_KERNEL= TRITON_INTERPRET=0 timeout 150 "$PY" -m pytest -q -p no:cacheprovider \
  tests/test_kernel_cuda.py tests/test_kernel_csr.py 2>&1 | tail -n 15

echo "== 2. arxiv-like graph"
DATA=${FG_DATA:-/tmp/fg-data}
if [[ ! -d "$DATA/arxiv_synth" ]]; then
  timeout 150 "$PY" -m fullgraph.cli data synth --preset arxiv --name arxiv-synth --root "$DATA" \
    || echo "data synth failed: bench/kernels.py falls back to its own generator"
fi

echo "== 3. spmm on the GPU vs cuSPARSE (F=128)"
timeout 120 "$PY" bench/kernels.py --device cuda --graphs arxiv --features 64,128,256 --rounds 20 \
  --data-root "$DATA" --out "$OUT_DIR/kernels_gpu.csv"

echo "== 4. one GPU: training epochs of the 3-layer GCN (hidden 256) on the arxiv-like graph"
timeout 240 "$PY" -m fullgraph.cli train --dataset arxiv-synth --root "$DATA" --device cuda \
  --model gcn --layers 3 --hidden 256 --dropout 0.5 --input-dropout 0 --epochs 10 --quiet \
  --log-json "$OUT_DIR/gpu_train.jsonl"
"$PY" - "$OUT_DIR/gpu_train.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
epochs = [r for r in rows if not r.get("final")]
final = rows[-1]
print(f"one GPU, 3-layer GCN hidden 256 on arxiv-synth: median epoch {final['median_epoch_s']:.4f} s "
      f"(first {epochs[0]['epoch_s']:.3f} s), step {epochs[-1]['compute_s']:.4f} s compute, "
      f"test acc {final['test_acc']:.4f}, peak host RSS {max(r['peak_rss_mb'] for r in epochs):.0f} MiB")
PY
