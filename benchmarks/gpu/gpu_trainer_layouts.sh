#!/usr/bin/env bash
# The trainer's layouts on one GPU, random weights (no checkpoint or network needed):
#   PART=fsdp   the 1.5B recipe's trainer step (benchmarks/bench_trainer_step.py), the plain
#               trainer against one FSDP2 rank: what the wrapper costs
#   PART=lora   the Qwen3-8B shape with LoRA (r=16) through the whole job, trainer and actor
#               sharing the GPU: the step time split, both processes' memory, sync bytes and time
# Needs ray, trl, peft and datasets importable and a tokenizer folder in TOKENIZER (see
# benchmarks/gpu/gpu_grpo_timing.sh for how to save one). JSON reports go to $OUT_DIR.
#
#   TOKENIZER=tok PART=fsdp bash benchmarks/gpu/gpu_trainer_layouts.sh
set -o pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT_DIR=${OUT_DIR:-gpu_out}
PY=${PY:-python3}
PART=${PART:-fsdp}
RUN=$(mktemp -d /tmp/trainer-layouts-XXXX)
mkdir -p "$OUT_DIR"
if [ -z "${TOKENIZER:-}" ] || [ ! -d "$TOKENIZER" ]; then
  echo "error: set TOKENIZER to a folder holding a tokenizer" >&2
  exit 2
fi
if [ "$PART" = fsdp ]; then
  COMPLETION=${COMPLETION:-2048}
  $PY benchmarks/make_random_model.py --shape qwen2.5-1.5b --tokenizer "$TOKENIZER" \
    --out "$RUN/model" || exit 1
  for variant in plain fsdp; do
    flag=()
    [ "$variant" = fsdp ] && flag=(--fsdp)
    $PY benchmarks/bench_trainer_step.py "${flag[@]}" --config configs/qwen2.5-1.5b-gsm-16k.yaml \
      model="$RUN/model" trainer.max_steps="${STEPS:-5}" trainer.max_completion_length="$COMPLETION" \
      rollout.engine.max_model_len=$((COMPLETION + 256)) --json-out "$OUT_DIR/trainer_step_$variant.json" \
      2>&1 | grep -v "it/s]\|s/it]\|Loading weights" | tail -5 || exit 1
  done
elif [ "$PART" = lora ]; then
  SHAPE=qwen3-8b STEPS=${STEPS:-3} COMPLETION=${COMPLETION:-1024} \
    EXTRA="trainer.lora.r=16 trainer.learning_rate=1e-5 trainer.prompts_per_step=8 ${EXTRA:-}" \
    OUT_DIR="$OUT_DIR" PY="$PY" TOKENIZER="$TOKENIZER" bash benchmarks/gpu/gpu_grpo_timing.sh
fi
