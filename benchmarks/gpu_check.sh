#!/usr/bin/env bash
# GPU throughput check (H100/H200 class), no network needed: tuneline LoRA vs plain TRL SFTTrainer,
# then QLoRA 4-bit, on a randomly initialised Qwen2.5-0.5B-shaped model; prints one table.
#   bash benchmarks/gpu_check.sh [--steps 30] [--seq-len 2048] [--batch 4]
# Record the table in benchmarks/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 DO_NOT_TRACK=true PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true
PYTHON="${PYTHON:-python}"
if ! "$PYTHON" -c "import tuneline" 2>/dev/null; then
  "$PYTHON" -m pip install -q -e . >/dev/null
fi
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU (use --tiny with python benchmarks/gpu_check.py for a CPU dry run)')"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
