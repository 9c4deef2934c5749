#!/usr/bin/env bash
# The RL-shaped speed figures of one GPU, each part under its own time limit:
#   - grpo on the Qwen3-8B shape (per-step floor, regimes, tail, KV sharing),
#   - where each regime's decode step goes, with the cost of a verification of 4 drafts,
#   - speculation's cost where no draft comes (a tail-only grpo mix, off against ngram),
#   - the Qwen3-30B-A3B shape with the fused experts and routing against transformers' path,
#     at 32 and 128 requests, and its decode steps with the routing kernel on and off,
#   - multi-turn episodes with slow tools against the same tokens in one turn.
#   bash benchmarks/gpu/gpu_rl_speed.sh        (about 16 minutes on one H200)
# Logs and JSON go to $OUT_DIR (default ./gpu_out); ROLLOUT_COMMIT=<sha> names the commit.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT_DIR=${OUT_DIR:-gpu_out}
mkdir -p "$OUT_DIR"
run() {  # run NAME SECONDS ARGS...: one benchmark, its log, the lines that matter
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" python3 "$@" > "$OUT_DIR/$name.log" 2>&1
  echo "$name: rc=$?"
  grep -E "^\[(bench|regimes|multi-turn)\]   |^\[bench\]     |^\[multi-turn\]|^\||Error" \
    "$OUT_DIR/$name.log" | grep -v "\.\.\. " | tail -12
}
run grpo_qwen3-8b 300 benchmarks/bench_rollout.py --workload grpo --modes overlap \
  --json-out "$OUT_DIR/grpo_qwen3-8b.json"
run decode_regimes 300 benchmarks/bench_decode_regimes.py --shape qwen3-8b --verify-drafts 4 \
  --points 1x1024,4x2048,8x2048,8x8192,16x4096,64x4096 --json-out "$OUT_DIR/decode_regimes.json"
TAIL=(--workload grpo --prompts 2 --group-size 4 --length-max 4096 --modes overlap)
for spec in none ngram; do
  run "tail_$spec" 90 benchmarks/bench_rollout.py "${TAIL[@]}" --engine speculative=$spec \
    --json-out "$OUT_DIR/tail_$spec.json"
done
for fused in true false; do  # false: transformers' experts and routers
  run "qwen3-30b-a3b_fused_$fused" 120 benchmarks/bench_rollout.py --workload qwen3-30b-a3b \
    --modes overlap --engine fused_moe=$fused --engine fused_routing=$fused \
    --json-out "$OUT_DIR/qwen3-30b-a3b_fused_$fused.json"
done
run qwen3-30b-a3b-128 150 benchmarks/bench_rollout.py --workload qwen3-30b-a3b-128 \
  --modes overlap --json-out "$OUT_DIR/qwen3-30b-a3b-128_fused.json"
for routing in true false; do
  run "decode_regimes_moe_routing_$routing" 100 benchmarks/bench_decode_regimes.py \
    --shape qwen3-30b-a3b --points 1x1024,8x2048,32x1280,128x1280 --steps 20 \
    --engine fused_routing=$routing --json-out "$OUT_DIR/decode_regimes_moe_routing_$routing.json"
done
run multi_turn 200 benchmarks/bench_multi_turn.py --shape qwen3-8b \
  --json-out "$OUT_DIR/multi_turn.json"
