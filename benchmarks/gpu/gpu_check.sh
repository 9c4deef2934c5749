#!/usr/bin/env bash
# The checks of a machine with a CUDA GPU: GPU tests, the attention kernel, the 8B weight sync
# with the trainer and an actor sharing the GPU (one-GPU machines), and the rollout benchmarks.
#   bash benchmarks/gpu/gpu_check.sh [workloads...]  (default: gpu-smoke w1 w3; "none": none)
# Needs ray, trl and datasets importable for the GPU tests of the job. Logs and JSON go to
# $OUT_DIR (default ./gpu_out). Each part has its own time limit so one hang cannot eat the
# others' time.
set -o pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT_DIR=${OUT_DIR:-gpu_out}
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT_DIR/device.txt"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, \
  'transformers', transformers.__version__, 'triton', triton.__version__)" |
  tee -a "$OUT_DIR/device.txt"
timeout ${PYTEST_TIMEOUT:-600} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu 2>&1 |
  tee "$OUT_DIR/pytest_gpu.log" | tail -25
timeout 120 python3 benchmarks/bench_attention.py --json-out "$OUT_DIR/attention.json" 2>&1 |
  tee "$OUT_DIR/attention.log"
if [ "$(nvidia-smi -L | wc -l)" -eq 1 ]; then
  timeout 240 python3 benchmarks/bench_scale.py --workload w1 --actors 1 --no-throughput \
    --sync-backend cuda_ipc,gloo --sync-repeats 2 --json-out "$OUT_DIR/sync_shared_gpu.json" 2>&1 |
    tee "$OUT_DIR/sync_shared_gpu.log" | grep -E "^\[scale\]|^\||Error"
fi
workloads=("$@")
[ ${#workloads[@]} -eq 0 ] && workloads=(gpu-smoke w1 w3)
[ "${workloads[0]}" = none ] && workloads=()
for w in "${workloads[@]}"; do
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_rollout.py --workload "$w" ${BENCH_ARGS:-} \
    --json-out "$OUT_DIR/bench_$w.json" 2>&1 | tee "$OUT_DIR/bench_$w.log" |
    grep -v "^\[bench\]   \|it/s"
done
