#!/usr/bin/env bash
# GPU tests and benchmarks on a two-GPU machine (nvidia-h200-x2) in one call of under 10 minutes:
#
#   bash scripts/gpu_check_x2.sh 2>&1 | tee $OUT/x2.log
#
#   GPU 0: the `long` workload (about 7 minutes), alone but for the small trainer-side pieces of
#          the two-GPU tests (the trainer takes GPU 0, as in the GRPO job: a tiny model, and an
#          8B copy for the sync timing, hence --gpu-memory-utilization 0.85 for `long`).
#   GPU 1: the actor of the two-GPU tests and of the 8B weight-sync timing, then the single-GPU
#          tests, w1 and w3.
#
# Needs `source .devkit/install.sh` first (ray, trl, datasets). At most 8 files come back from
# the device tool: JSON goes to $OUT (or ./gpu_out), plots only for long and w1.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
OUT=${OUT:-gpu_out}
LONG_DEADLINE_S=${LONG_DEADLINE_S:-510}
mkdir -p "$OUT" /tmp/x2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

CUDA_VISIBLE_DEVICES=0 python3 scripts/bench_rollout.py --workload long --modes overlap \
  --gpu-memory-utilization 0.85 --deadline-s "$LONG_DEADLINE_S" --json-out "$OUT/long.json" \
  >/tmp/x2/long.log 2>&1 &
long_pid=$!

echo "== two-GPU tests (trainer on GPU 0, actor on GPU 1)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_train_gpu.py 2>&1 |
  grep -E "passed|failed|Error|error|assert" | tail -15
echo "== 8B weight sync, trainer GPU 0 -> actor GPU 1"
timeout 150 python3 scripts/bench_scale.py --workload w1 --actors 1 --no-throughput \
  --json-out "$OUT/sync_8b.json" 2>&1 | grep -E "^\[scale\]|^\||Error"
echo "== single-GPU tests on GPU 1"
CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu 2>&1 |
  grep -E "passed|failed|Error|FAILED" | tail -12
echo "== w1 and w3 on GPU 1"
CUDA_VISIBLE_DEVICES=1 timeout 100 python3 scripts/bench_rollout.py --workload w1 \
  --json-out "$OUT/w1.json" 2>&1 | grep -E "^\||^w1|Error"
CUDA_VISIBLE_DEVICES=1 timeout 70 python3 scripts/bench_rollout.py --workload w3 \
  --json-out /tmp/x2/w3.json 2>&1 | grep -E "^\||^w3|Error"
cp /tmp/x2/w3.json "$OUT/w3.json" 2>/dev/null

echo "== long (GPU 0)"
wait $long_pid
grep -v "it/s" /tmp/x2/long.log | tail -12
