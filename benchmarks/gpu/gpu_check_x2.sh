#!/usr/bin/env bash
# The checks of a machine with two or more GPUs, in two parts of under 10 minutes each. Needs
# ray, trl and datasets importable. Logs and JSON go to $OUT_DIR (default ./gpu_out).
#
#   ROLLOUT_COMMIT=<sha> bash benchmarks/gpu/gpu_check_x2.sh sync 2>&1 | tee x2_sync.log
#   ROLLOUT_COMMIT=<sha> bash benchmarks/gpu/gpu_check_x2.sh scale 2>&1 | tee x2_scale.log
#
# sync  1. benchmarks/gpu/check_nccl.py: a bare NCCL broadcast in each process/GPU layout;
#       2. the two-GPU tests: trainer on GPU 0, an actor on GPU 1 (three GRPO steps, NCCL sync);
#       3. the 8B-shaped weight sync, trainer GPU 0 -> actor GPU 1 (target: <= 1 s).
# scale 4. rollout throughput through the pool at 1 and 2 actors on w1 (scaling efficiency).
# Then `bash benchmarks/gpu/gpu_grpo_timing.sh` times the GPU recipe's GRPO steps.
#
# Nothing runs concurrently. Step 1 tells a broken NCCL layout apart from a sync that fails in
# the job (docs/performance.md, 'Two GPUs'). ROLLOUT_COMMIT names the commit the JSON records:
# a copied working tree's .git may be stale.
set -o pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT_DIR=${OUT_DIR:-gpu_out}
PART=${1:-sync}
mkdir -p "$OUT_DIR"
[ -z "${ROLLOUT_COMMIT:-}" ] && echo "warning: ROLLOUT_COMMIT is not set; the JSON may name a stale commit"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

case "$PART" in
sync)
  echo "== 1. NCCL layouts"
  NCCL_DEBUG=WARN timeout 120 python3 benchmarks/gpu/check_nccl.py --timeout-s 30 2>&1 | tail -30
  echo "== 2. two-GPU tests (trainer on GPU 0, actor on GPU 1)"
  timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/gpu/test_train_gpu.py 2>&1 |
    grep -E "PASSED|FAILED|SKIPPED|passed|failed|Error|assert" | tail -20
  echo "== 3. 8B weight sync, trainer GPU 0 -> actor GPU 1"
  timeout 200 python3 benchmarks/bench_scale.py --workload w1 --actors 1 --no-throughput \
    --sync-backend nccl,gloo --sync-repeats 3 --json-out "$OUT_DIR/sync_8b_x2.json" 2>&1 |
    grep -E "^\[scale\]|^\||Error"
  ;;
scale)
  echo "== 4. w1 through the pool at 1 and 2 actors"
  timeout 540 python3 benchmarks/bench_scale.py --workload w1 --actors 1,2 --sync-repeats 0 \
    --json-out "$OUT_DIR/scale_w1_x2.json" 2>&1 | grep -E "^\[scale\]|^\||Error"
  ;;
*)
  echo "usage: bash benchmarks/gpu/gpu_check_x2.sh sync|scale" >&2
  exit 2
  ;;
esac
