#!/usr/bin/env bash
# The rollout/trainer mismatch by position on one GPU (benchmarks/bench_mismatch.py), per shape.
#   bash benchmarks/gpu/gpu_mismatch.sh [shapes...]   (default: qwen3-8b qwen3-30b-a3b)
# Env: SAMPLES (4), LENGTH (16384), PROMPT_LEN (256), OUT_DIR (./gpu_out), BENCH_TIMEOUT (420 s).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT_DIR=${OUT_DIR:-gpu_out}
mkdir -p "$OUT_DIR"
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(qwen3-8b qwen3-30b-a3b)
for s in "${shapes[@]}"; do
  timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench_mismatch.py --shape "$s" \
    --samples ${SAMPLES:-4} --length ${LENGTH:-16384} --prompt-len ${PROMPT_LEN:-256} \
    --json-out "$OUT_DIR/mismatch_$s.json" 2>&1 | tee "$OUT_DIR/mismatch_$s.log" | grep -v "it/s"
done
