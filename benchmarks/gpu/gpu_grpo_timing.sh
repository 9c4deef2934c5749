#!/usr/bin/env bash
# A timing run of the GPU recipe (configs/qwen2.5-1.5b-gsm-16k.yaml) on random weights, in under
# 10 minutes. The job places it: the trainer on GPU 0 and an actor on every other GPU (NCCL sync),
# or, on a one-GPU machine, the trainer and one actor sharing it (CUDA IPC). Needs ray, trl and
# datasets importable, and a tokenizer folder in TOKENIZER:
#
#   TOKENIZER=tok ROLLOUT_COMMIT=<sha> bash benchmarks/gpu/gpu_grpo_timing.sh 2>&1 | tee grpo.log
#
# No checkpoint or network is needed: the model is the recipe's shape with random weights and the
# tokenizer in $TOKENIZER (see benchmarks/make_random_model.py), and the prompts are the built-in
# arithmetic task. Every shape, memory figure and time is real; rewards are noise. Random weights
# rarely sample EOS, so every completion runs to COMPLETION tokens: the recipe's 16K would take
# minutes per step, hence 4096 by default. summary.json (copied to $OUT_DIR, default ./gpu_out)
# holds the step time split: rollout wait, forward + backward, weight sync.
#
# Settings (environment): STEPS (4), COMPLETION (4096), SHAPE (qwen2.5-1.5b), EXTRA (more dotted
# overrides, applied last), PROFILE=1 (sample the trainer process's threads with py-spy, waits
# included, into $OUT_DIR/trainer_profile.txt, collapsed stacks) or PROFILE=gil (only the thread
# holding the GIL, into $OUT_DIR/trainer_gil_profile.txt); both need py-spy (0.4.3 was used).
# TOKENIZER can be any tokenizer folder; the built-in model's, saved once:
#   python -c "from rollout.builtin_models import smollm2_path; from transformers import \
#     AutoTokenizer; AutoTokenizer.from_pretrained(smollm2_path()).save_pretrained('tok')"
# A CPU dry run of the plumbing:
#   SHAPE=tiny STEPS=1 COMPLETION=16 PY=.venv/bin/python TOKENIZER=tok \
#     EXTRA="trainer.dtype=float32 trainer.gradient_checkpointing=false \
#     rollout.engine.dtype=float32" bash benchmarks/gpu/gpu_grpo_timing.sh
set -o pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT_DIR=${OUT_DIR:-gpu_out}
if [ -z "${TOKENIZER:-}" ] || [ ! -d "$TOKENIZER" ]; then
  echo "error: set TOKENIZER to a folder holding a tokenizer (the header says how to make one)" >&2
  exit 2
fi
STEPS=${STEPS:-4}
COMPLETION=${COMPLETION:-4096}
SHAPE=${SHAPE:-qwen2.5-1.5b}
PY=${PY:-python3}
RUN=$(mktemp -d /tmp/grpo-timing-XXXX)
mkdir -p "$OUT_DIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

$PY benchmarks/make_random_model.py --shape "$SHAPE" --tokenizer "$TOKENIZER" \
  --out "$RUN/model" || exit 1
LAUNCH=()
if [ "${PROFILE:-0}" = 1 ]; then
  # --idle keeps the samples where a thread waits (on the GPU, a queue, a lock): the point is
  # where the step's wall time goes, not only its CPU time.
  LAUNCH=(py-spy record --idle --threads --nonblocking --rate 20 --format raw
    -o "$OUT_DIR/trainer_profile.txt" --)
elif [ "${PROFILE:-0}" = gil ]; then
  # Only the thread holding the GIL at each sample: which Python work competes with the
  # training loop's.
  LAUNCH=(py-spy record --gil --threads --nonblocking --rate 50 --format raw
    -o "$OUT_DIR/trainer_gil_profile.txt" --)
fi
# shellcheck disable=SC2086  # EXTRA is a list of overrides
timeout ${JOB_TIMEOUT:-480} "${LAUNCH[@]}" $PY scripts/train_grpo.py --config configs/qwen2.5-1.5b-gsm-16k.yaml \
  model="$RUN/model" output_dir="$RUN/job" dataset.source=arithmetic dataset.num_examples=512 \
  trainer.max_steps="$STEPS" trainer.max_completion_length="$COMPLETION" \
  rollout.engine.max_model_len=$((COMPLETION + 256)) \
  wandb.mode=disabled $EXTRA 2>&1 |
  grep -v "it/s]\|s/it]\|Loading weights"
status=$?
cp "$RUN/job/summary.json" "$OUT_DIR/grpo_summary.json" 2>/dev/null &&
  cat "$OUT_DIR/grpo_summary.json"
exit $status
