#!/usr/bin/env bash
# The two-GPU checks (nvidia-h200-x2) in one call of under 10 minutes, one step at a time:
#
#   source .devkit/install.sh && bash scripts/gpu_check_x2.sh 2>&1 | tee $OUT/x2.log
#
#   1. scripts/check_nccl.py: our weight-sync group in each process/GPU layout (about 1 minute);
#   2. the two-GPU tests: trainer on GPU 0, an actor on GPU 1;
#   3. the 8B-shaped weight sync, trainer GPU 0 -> actor GPU 1 (issue target: <= 1 s);
#   4. rollout throughput through the pool at 1 and 2 actors on w1 (scaling efficiency).
#
# Nothing runs concurrently: an earlier version ran the `long` benchmark on GPU 0 next to the
# trainer side of steps 2-3, and those steps hung with no output, so a layout problem could not
# be told apart from contention. At most 8 files come back from the device tool: JSON to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m

echo "== 1. NCCL layouts"
NCCL_DEBUG=WARN timeout 150 python3 scripts/check_nccl.py 2>&1 | tail -40
echo "== 2. two-GPU tests (trainer on GPU 0, actor on GPU 1)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_train_gpu.py 2>&1 |
  grep -E "passed|failed|Error|error|assert" | tail -15
echo "== 3. 8B weight sync, trainer GPU 0 -> actor GPU 1"
timeout 120 python3 scripts/bench_scale.py --workload w1 --actors 1 --no-throughput \
  --json-out "$OUT/sync_8b.json" 2>&1 | grep -E "^\[scale\]|^\||Error"
echo "== 4. w1 through the pool at 1 and 2 actors"
timeout 200 python3 scripts/bench_scale.py --workload w1 --actors 1,2 --sync-repeats 0 \
  --json-out "$OUT/scale_w1.json" 2>&1 | grep -E "^\[scale\]|^\||Error"
