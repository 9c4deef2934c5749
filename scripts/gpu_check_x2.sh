#!/usr/bin/env bash
# GPU tests and benchmarks on a two-GPU machine (nvidia-h200-x2), in two calls of < 10 minutes:
#
#   bash scripts/gpu_check_x2.sh phase1   # GPU 0: `long` (detached, outlives the call);
#                                         # GPU 1: w1 (+ transformers), w1-8k, single-GPU tests
#   bash scripts/gpu_check_x2.sh phase2   # waits for `long`, then two-GPU tests, bench_scale
#                                         # (1 and 2 actors, 8B weight sync), a GRPO timing run
#
# Needs `source .devkit/install.sh` first (ray, trl, datasets) and, for the GRPO run, a tokenizer
# in .devdata/smollm2-tokenizer. JSON and plots go to $OUT (or ./gpu_out), at most 8 files per
# call (the device tool's limit): pipe the script's own output to a log there. `long` writes to
# /tmp/long until phase2 copies it.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
OUT=${OUT:-gpu_out}
mkdir -p "$OUT" /tmp/long

bench() {  # bench GPU LIMIT_S NAME ARGS...
  local gpu=$1 limit=$2 name=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 scripts/bench_rollout.py "$@" \
    --json-out "$OUT/$name.json" 2>&1 | grep -v "it/s"
}

case ${1:-} in
phase1)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  # `long` runs alone on GPU 0 in its own session, so it survives this call's end.
  CUDA_VISIBLE_DEVICES=0 setsid nohup python3 scripts/bench_rollout.py --workload long \
    --modes overlap --json-out /tmp/long/long.json >/tmp/long/long.log 2>&1 &
  bench 1 270 w1 --workload w1 --compare-transformers --transformers-modes async \
    --profile-steps 20 --deadline-s 120
  bench 1 130 w1-8k --workload w1-8k --modes overlap
  CUDA_VISIBLE_DEVICES=1 timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu \
    2>&1 | tail -15
  tail -3 /tmp/long/long.log
  ;;
phase2)
  for _ in $(seq 1 60); do  # up to 5 minutes more for `long`
    pgrep -f "workload long" >/dev/null || break
    sleep 5
  done
  cp /tmp/long/long.json /tmp/long/long.png /tmp/long/long.log "$OUT/" 2>/dev/null
  grep -v "it/s" /tmp/long/long.log | tail -8
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_train_gpu.py \
    2>&1 | tail -8
  timeout 240 python3 scripts/bench_scale.py --workload w1 --actors 1,2 \
    --json-out "$OUT/scale_w1.json" 2>&1 | grep "^\[scale\]\|^|\|Error"
  python3 scripts/make_random_model.py --shape qwen2.5-1.5b \
    --tokenizer .devdata/smollm2-tokenizer --out /tmp/q15 &&
  timeout 200 python3 scripts/train_grpo.py --config configs/qwen2.5-1.5b-gsm-16k.yaml \
    model=/tmp/q15 dataset.source=arithmetic trainer.max_steps=3 \
    trainer.max_completion_length=1024 wandb.mode=disabled output_dir=/tmp/grpo \
    "rollout.engine={max_model_len: 2048, max_num_seqs: 128, dtype: bfloat16}" \
    2>&1 | grep -v "it/s" | tail -25
  cp /tmp/grpo/summary.json "$OUT/grpo_summary.json" 2>/dev/null
  ;;
*)
  echo "usage: $0 phase1|phase2" >&2
  exit 2
  ;;
esac
