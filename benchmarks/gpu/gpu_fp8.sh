#!/usr/bin/env bash
# FP8 weights on one GPU, each part under its own time limit:
#   tests    the GPU tests (all of tests/gpu, or GPU_TESTS): over 10 minutes on one H200, so
#            tests1 (engine, FP8, attention kernels) and tests2 (the rest) fit one call each;
#            with pytest-xdist, PYTEST_WORKERS=6 runs all of them in about 4 minutes
#   gemm     the decode GEMMs of the Qwen3-8B shape: cuBLAS bf16, Triton bf16, Triton FP8
#   gemm-sweep  the FP8 GEMM's tile choices, tail to crowded steps (SWEEP_ROWS: 8 16 32 64 128)
#   gemm-scaled the decode GEMMs with torch._scaled_mm beside them (GEMM_ROWS: 16 32 64 128)
#   w1       qwen3-8b-w1 (32 x (256 + 2048)), bf16 then FP8 weights
#   w1-main  the same workload in main's FP8 setting (grpo-w8a8-head-input's), then bf16
#   grpo     the grpo workload on the Qwen3-8B shape, bf16 then FP8 weights
#   grpo-moe the grpo workload on the Qwen3-30B-A3B shape (GRPO_MOE_ARGS), bf16 then FP8
#   tail     a tail-only grpo mix (2 prompts x 4 samples, up to 4,096 tokens), bf16 then FP8
#   moe      one MoE layer's experts (Qwen3-30B-A3B), bf16 and FP8 weights
#   drift    FP8 rollouts against the bf16 trainer (bench_mismatch.py), dense and MoE
#   grpo-kv  the grpo workload on the Qwen3-8B shape: bf16, then FP8 weights and FP8 KV cache
#   grpo-fp8-kv  only the latter (after a grpo part in the same call)
#   grpo-all the grpo workload on the Qwen3-8B shape: bf16, FP8 weights, FP8 weights and KV
#            (about 9.5 minutes on one H200: a call of its own)
#   grpo-fp8-kv-bf16  the same with the FP8 cache's K tiles widened to bf16, not fp16
#   attn-kv  the decode attention kernel alone at a grpo run's batches, bf16 against FP8 KV
#   regimes-kv  decode steps by kernel kind at grpo's batches (REGIME_POINTS), FP8 weights with a
#            bf16 then an FP8 cache, at the points' own max_model_len then at grpo's (16,999
#            tokens, 128 sequences: a grpo run's KV pool and decode grid; about 5 minutes;
#            REGIME_BOUNDS=grpo for the second half alone)
#   attn-shared  the decode kernel alone at grpo's batches (SHARED_POINTS), each group of 8
#            sequences reading its 600-token prompt's pages, then the same without sharing
#   attn-mixed  the same at batches of mixed contexts (grpo's lengths; MIXED_POINTS)
#   grpo-pieces  grpo with FP8 weights and KV, the FP8 cache's full-batch pieces up to 2,048
#            tokens (the default) then up to 1,024 (about 6 minutes on one H200)
#   profile-kv  one decode attention launch over an FP8 cache (PROFILE_POINT, default 64x4096)
#            under Nsight Compute (ncu) for each of PROFILE_CHOICES (bench_attention's names,
#            ';'-separated), its instructions by opcode (benchmarks/sass_mix.py) and the
#            profile's details (throughputs, occupancy, stalls) as CSV
#   gemm-w8a8  the W8A8 GEMM (activation_quantization=fp8) beside bf16 and FP8 weights, and its
#            tile choices from 17 rows (W8A8_ROWS: 8 16 32 64 128)
#   gemm-w8a8-narrow  the same with narrower column blocks, deeper pipelines and 2 warps among
#            the tile choices (W8A8_ROWS: 1 8 32)
#   drift-w8a8 FP8 weights, activations and LM head against the bf16 trainer (Qwen3-8B shape),
#            then FP8 weights alone in the same call
#   drift-head FP8 weights and LM head against the bf16 trainer (Qwen3-8B shape)
#   grpo-head  the grpo workload on the Qwen3-8B shape: FP8 weights, KV cache and LM head
#   grpo-bf16  the grpo workload on the Qwen3-8B shape in bf16 alone
#   grpo-w8a8  the same with FP8 weights, KV cache, activations and LM head (GRPO_W8A8_EXTRA:
#            more --engine overrides)
#   grpo-w8a8-group  the same with the activations' scales per 128 inputs (fp8-group)
#   grpo-w8a8-head-input  grpo-w8a8 with the FP8 LM head's input rounded too (fp8_lm_head_input)
#   grpo-one-warp-wide  grpo-w8a8-head-input with one-warp launches over an FP8 cache from 16
#            sequences of 8 KV heads, aiming at 1,024 programs (DecodeTiles.fp8_one_warp_*)
#   drift-head-input  that setting's drift against the bf16 trainer (Qwen3-8B shape)
#   drift-w8a8-group  FP8 weights, activations with scales per 128 inputs and LM head against
#            the bf16 trainer (Qwen3-8B shape)
#   regimes-w8a8  decode steps by kernel (the top 24 kernels of each point) at a tail's and a
#            crowded step's batches (REGIME_POINTS), FP8 weights, KV and LM head: activations
#            unrounded, rounded with a scale a row, with a scale per 128 inputs
#   profile-gemm  one launch of the FP8 decode GEMM under Nsight Compute for each of
#            PROFILE_PROJECTIONS (qkv down) at PROFILE_ROWS (1 8): stalls, SASS mix, details CSV
#   regimes-e4m3  the same steps with activations rounded a scale a row, by the GPU's e4m3
#            conversion instruction and by the bit arithmetic (--e4m3-bits)
#   launch-floor  the FP8-weight and W8A8 decode GEMMs at FLOOR_ROWS (1 8): whole, over one K
#            tile a program, and an empty launch of the same grid (bench_gemm.py --launch-floor)
#   routes-w8a8  each output's W8A8 GEMM by the FP8-MMA kernel and by torch's FP8 GEMM, beside
#            cuBLAS bf16 (ROUTE_ROWS: 64,96,128; bench_gemm.py --w8a8-routes)
#   attn-registers  the FP8 decode read at crowded batches (REGISTER_POINTS) in 4-warp programs
#            of 128-token tiles, with its registers capped (DecodeTiles.max_registers 96, 80:
#            five or six programs an SM) and not, against the default (1-warp programs)
#   attn-crowded  the FP8 decode read from 16 to 128 sequences (CROWDED_POINTS: equal contexts,
#            and contexts drawn as grpo's, BxC~) with the full batch's 1-warp programs of
#            32-token tiles (the default), without, and from 16 sequences aiming at 1,024
#            programs, beside bf16
#   attn-one-warp-registers  the same points with the 1-warp programs' registers capped
#            (DecodeTiles.fp8_one_warp_max_registers 128 and 104: 16 and 19 programs an SM,
#            where uncapped they take 151-159 registers, 12 an SM), also from 16 sequences
#   grpo-one-warp-registers  grpo-w8a8-head-input with the 1-warp programs' registers capped at
#            ONE_WARP_REGISTERS (default 128)
#   attn-one-warp-stages  the same points with the 1-warp programs' pipeline stages at the
#            default (3: one K/V buffer), 5 (two) and 7 (three), beside four-warp programs,
#            one-warp ones from 16 sequences, and bf16
#   grpo-one-warp-stages  grpo-w8a8-head-input with the 1-warp programs' stages at ONE_WARP_STAGES
#            (default 5: two K/V buffers)
#   attn-scales  the FP8 decode read with the scales head by head (the engine's layout) and by
#            slot, beside bf16, at a grpo run's (running, context) pairs (SCALES_POINTS: equal
#            contexts, as a grpo run's samples have)
#   attn-merge-pairs  the FP8 decode read at those pairs (MERGE_POINTS) with the 1-warp
#            programs' merge loads of 16 and 8 pairs (fewer registers: 12 programs an SM, where
#            the default's 187 registers allow 8), also aiming at 2,048 programs (from 16
#            sequences too), beside the default and bf16
#   attn-k-by-head  the FP8 decode read with K laid out head by head in each page (a page's keys
#            of one KV head in one 2 KB run, as V's are: the engine's layout) against K by slot,
#            beside bf16, at those pairs (MERGE_POINTS)
#   attn-k-by-head-tiles  the same read in one-warp programs (the default), four-warp ones, and
#            four-warp ones of pieces up to 1,024 tokens, beside K by slot, at a grpo run's
#            pairs and at contexts drawn as grpo's (KHEAD_POINTS)
#   regimes-main  decode steps by kernel (bench_decode_regimes.py) at REGIME_POINTS in main's FP8
#            setting (weights, KV, activations, LM head and its input), then in bf16
#   regimes-code  the same at CODE_POINTS (default 8x10000), unprofiled, with inductor's generated
#            code in the logs (TORCH_LOGS=output_code): the kernels' source and launch configs
#   attn-full-batch-tiles  the FP8 decode read from 256 (sequence, KV head) pairs in programs of
#            other tiles: 4 and 8 warps of 256 tokens, 1 and 2 warps of 64, 2 of 128, beside the
#            default (1 warp of 32 tokens) and bf16, at a grpo run's pairs (FULL_BATCH_POINTS)
#   attn-pages  the decode read at a grpo run's pairs over pages of each of PAGES tokens
#            (default 32 64 128), bf16 and FP8 caches
#   attn-tail-tiles  the FP8 decode read at a grpo tail's batches (TAIL_POINTS: one to 24
#            sequences, the four-warp launches) in tiles of 128 tokens (the default), 64 and 32,
#            and in pieces of up to 1,024 tokens, beside bf16
#   grpo-pages  grpo-w8a8-head-input over pages of each of GRPO_PAGES tokens (default 64)
#   grpo-tiles  grpo-w8a8-head-input with the --decode-tiles fields of GRPO_TILES
#            ("field=val ..."), its JSON named grpo_qwen3-8b_$GRPO_NAME (default tiles)
#   grpo-one-warp-merge  grpo-w8a8-head-input with the 1-warp programs' merge loads of
#            ONE_WARP_MERGE_PAIRS (default 16) pairs, and ONE_WARP_EXTRA (more --decode-tiles
#            fields, e.g. "fp8_one_warp_target_programs=2048")
#   grpo-qk-rope-off  grpo-w8a8-head-input with Qwen3's q/k norms and rotary as torch.compile
#            makes them (fused_qk_rope=false); grpo-bf16-qk-rope-off the same in bf16
#   regimes-qk-rope-off  regimes-main with fused_qk_rope=false
#   rounding  the FP8 activations' rounding kernels alone (bench_rounding.py), with and without
#            the rounded rows in bf16, at their own warps and at 8, 16 and 32
#   bash benchmarks/gpu/gpu_fp8.sh tests gemm w1   (parts in the order given)
# Logs and JSON go to $OUT_DIR (default ./gpu_out), the rollout runs' plots to $PLOT_DIR (default
# $OUT_DIR: point it elsewhere where only a few files can be brought back); ROLLOUT_COMMIT=<sha>
# names the commit.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled
OUT_DIR=${OUT_DIR:-gpu_out}
PLOT_DIR=${PLOT_DIR:-$OUT_DIR}
mkdir -p "$OUT_DIR" "$PLOT_DIR"
run() {  # run NAME SECONDS ARGS...: one benchmark, its log, the lines that matter
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" python3 "$@" > "$OUT_DIR/$name.log" 2>&1
  echo "$name: rc=$?"
  grep -E "^\[(bench|mismatch)\]   |^\[bench\]     |^\[(mismatch|moe)\]|^\||^  |Error" \
    "$OUT_DIR/$name.log" | grep -v "\.\.\. " | tail -${LINES_SHOWN:-14}
}
both() {  # both NAME SECONDS ARGS...: bf16 weights, then FP8 (and $FP8_EXTRA, e.g. the KV)
  local name=$1 seconds=$2
  shift 2
  for q in none fp8; do
    local extra=()
    [ "$q" = fp8 ] && [ -n "${FP8_EXTRA:-}" ] && extra=(--engine "$FP8_EXTRA")
    run "${name}_$q" "$seconds" benchmarks/bench_rollout.py "$@" --modes overlap \
      --engine weight_quantization=$q "${extra[@]}" --json-out "$OUT_DIR/${name}_$q.json" \
      --plot-out "$PLOT_DIR/${name}_$q.png"
  done
}
# main's FP8 setting: weights, KV cache, activations, LM head and its input
FP8_MAIN=(--engine weight_quantization=fp8 --engine kv_cache_dtype=fp8
  --engine activation_quantization=fp8 --engine fp8_lm_head=true --engine fp8_lm_head_input=true)
setting_flags() {  # setting_flags bf16|other: sets `settings` to bf16's flags, else FP8_MAIN
  if [ "$1" = bf16 ]; then settings=(--engine weight_quantization=none)
  else settings=("${FP8_MAIN[@]}"); fi
}
grpo_main() {  # grpo_main NAME ARGS...: the grpo workload in main's FP8 setting and ARGS
  local name=$1
  shift
  run "grpo_qwen3-8b_$name" 300 benchmarks/bench_rollout.py --workload grpo --modes overlap \
    "${FP8_MAIN[@]}" "$@" --json-out "$OUT_DIR/grpo_qwen3-8b_$name.json" \
    --plot-out "$PLOT_DIR/grpo_qwen3-8b_$name.png"
}
attn() {  # attn NAME SECONDS POINTS CHOICES: the decode read beside an FP8 cache, choice by choice
  LINES_SHOWN=${LINES_SHOWN:-16} run "attention_regimes_fp8_kv_$1" "$2" \
    benchmarks/bench_attention.py --regimes --fp8-kv --points "$3" --choices "$4" \
    --json-out "$OUT_DIR/attention_regimes_fp8_kv_$1.json"
}
regimes_main() {  # regimes_main NAME ARGS...: bench_decode_regimes in main's FP8 setting, then bf16
  local name=$1 setting
  shift
  for setting in fp8 bf16; do
    local settings
    setting_flags "$setting"
    run "decode_regimes_${name}_$setting" 180 benchmarks/bench_decode_regimes.py "$@" \
      "${settings[@]}" --json-out "$OUT_DIR/decode_regimes_${name}_$setting.json"
  done
}
# equal contexts and contexts drawn as grpo's (BxC~), 16-128 sequences
CROWDED=${CROWDED_POINTS:-16x8000,32x2000,32x5000,48x3000,64x1000,64x4096,96x1500,128x700,128x2000,32x4000~,48x3000~,64x2500~,96x1500~,128x800~}
# a grpo run's own (running, context) pairs from 16 running (its samples start together)
GRPO_PAIRS=16x8000,24x6000,32x4300,48x3200,64x2500,80x1900,96x1500,112x1000,128x700,32x2000,64x4096,128x2000
for part in "$@"; do
  case $part in
    tests|tests1|tests2)
      groups=(tests/gpu)
      [ "$part" = tests1 ] && groups=(tests/gpu/test_cuda_ipc_gpu.py tests/gpu/test_engine_gpu.py
        tests/gpu/test_fp8_gpu.py tests/gpu/test_kernels.py)
      [ "$part" = tests2 ] && groups=(tests/gpu/test_linear_gpu.py tests/gpu/test_moe_gpu.py
        tests/gpu/test_sampler_gpu.py tests/gpu/test_train_gpu.py)
      timeout ${PYTEST_TIMEOUT:-540} python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 \
        ${PYTEST_WORKERS:+-n $PYTEST_WORKERS} \
        ${GPU_TESTS:-${groups[@]}} 2>&1 | tee "$OUT_DIR/pytest_$part.log" | tail -25 ;;
    rounding) LINES_SHOWN=70 run rounding 180 benchmarks/bench_rounding.py --warps 8,16,32 \
      --json-out "$OUT_DIR/rounding.json" ;;
    gemm)
      for m in ${GEMM_ROWS:-8 32}; do
        run "gemm_qwen3-8b_m$m" ${GEMM_TIMEOUT:-120} benchmarks/bench_gemm.py --shapes qwen3-8b --m $m \
          ${GEMM_ARGS:-} --json-out "$OUT_DIR/gemm_qwen3-8b_m$m.json"
      done ;;
    gemm-sweep)
      for m in ${SWEEP_ROWS:-8 16 32 64 128}; do
        run "gemm_fp8_sweep_qwen3-8b_m$m" ${GEMM_TIMEOUT:-150} benchmarks/bench_gemm.py --shapes qwen3-8b \
          --m $m --fp8-sweep --json-out "$OUT_DIR/gemm_fp8_sweep_qwen3-8b_m$m.json"
      done ;;
    gemm-scaled)
      for m in ${GEMM_ROWS:-16 32 64 128}; do
        run "gemm_scaled_mm_qwen3-8b_m$m" ${GEMM_TIMEOUT:-120} benchmarks/bench_gemm.py --shapes qwen3-8b \
          --m $m --scaled-mm --json-out "$OUT_DIR/gemm_scaled_mm_qwen3-8b_m$m.json"
      done ;;
    w1) both w1_qwen3-8b 150 --workload qwen3-8b-w1 ;;
    w1-main)
      for setting in main bf16; do
        setting_flags "$setting"
        run "w1_qwen3-8b_$setting" 150 benchmarks/bench_rollout.py --workload qwen3-8b-w1 \
          --modes overlap "${settings[@]}" --json-out "$OUT_DIR/w1_qwen3-8b_$setting.json" \
          --plot-out "$PLOT_DIR/w1_qwen3-8b_$setting.png"
      done ;;
    grpo) both grpo_qwen3-8b 240 --workload grpo ;;
    grpo-kv) FP8_EXTRA=kv_cache_dtype=fp8 both grpo_kv_qwen3-8b 240 --workload grpo ;;
    grpo-all) both grpo_qwen3-8b 200 --workload grpo
      run grpo_qwen3-8b_fp8_kv 200 benchmarks/bench_rollout.py --workload grpo --modes overlap \
        --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
        --json-out "$OUT_DIR/grpo_qwen3-8b_fp8_kv.json" --plot-out "$PLOT_DIR/grpo_qwen3-8b_fp8_kv.png" ;;
    grpo-fp8-kv) run grpo_qwen3-8b_fp8_kv 240 benchmarks/bench_rollout.py --workload grpo \
      --modes overlap --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
      --json-out "$OUT_DIR/grpo_qwen3-8b_fp8_kv.json" --plot-out "$PLOT_DIR/grpo_qwen3-8b_fp8_kv.png" ;;
    grpo-fp8-kv-bf16) run grpo_qwen3-8b_fp8_kv_bf16 240 benchmarks/bench_rollout.py --workload grpo \
      --modes overlap --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
      --fp8-kv-tiles bf16 --json-out "$OUT_DIR/grpo_qwen3-8b_fp8_kv_bf16.json" \
      --plot-out "$PLOT_DIR/grpo_qwen3-8b_fp8_kv_bf16.png" ;;
    attn-kv) LINES_SHOWN=16 run attention_regimes_fp8_kv 240 benchmarks/bench_attention.py \
      --regimes --fp8-kv --json-out "$OUT_DIR/attention_regimes_fp8_kv.json" ;;
    regimes-kv)
      for bound in ${REGIME_BOUNDS:-points grpo}; do
        limits=()
        [ "$bound" = grpo ] && limits=(--engine max_model_len=16999 --engine max_num_seqs=128)
        for kv in auto fp8; do
          LINES_SHOWN=12 run "decode_regimes_fp8_weights_kv${kv}_$bound" 150 \
            benchmarks/bench_decode_regimes.py --steps 20 \
            --points ${REGIME_POINTS:-128x700,80x2300,40x4300,64x4096} \
            --engine weight_quantization=fp8 --engine kv_cache_dtype=$kv "${limits[@]}" \
            --json-out "$OUT_DIR/decode_regimes_fp8_weights_kv${kv}_$bound.json"
        done
      done ;;
    attn-shared)
      for prefix in 600 0; do
        LINES_SHOWN=8 run "attention_regimes_fp8_kv_shared$prefix" 200 benchmarks/bench_attention.py \
          --regimes --fp8-kv --shared-prefix $prefix --group-size 8 \
          --points ${SHARED_POINTS:-128x700,96x1200,64x2300,40x4300} \
          --json-out "$OUT_DIR/attention_regimes_fp8_kv_shared$prefix.json"
      done ;;
    attn-mixed) LINES_SHOWN=16 run attention_regimes_fp8_kv_mixed 240 benchmarks/bench_attention.py \
      --regimes --fp8-kv --points ${MIXED_POINTS:-16x3000~,32x3000~,48x2048~,64x1500~,128x1200~} \
      --json-out "$OUT_DIR/attention_regimes_fp8_kv_mixed.json" ;;
    grpo-pieces)
      for len in 2048 1024; do
        run "grpo_qwen3-8b_fp8_kv_pieces$len" 200 benchmarks/bench_rollout.py --workload grpo \
          --modes overlap --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
          --decode-tiles fp8_full_batch_split_len=$len \
          --json-out "$OUT_DIR/grpo_qwen3-8b_fp8_kv_pieces$len.json" \
          --plot-out "$PLOT_DIR/grpo_qwen3-8b_fp8_kv_pieces$len.png"
      done ;;
    profile-kv)
      IFS=';' read -ra profiled <<< "${PROFILE_CHOICES:-FP8 KV;FP8, query rows wide}"
      for choice in "${profiled[@]}"; do
        tag=$(printf '%s' "$choice" | tr -c 'a-zA-Z0-9' '_')
        timeout 240 ncu --set full -k regex:'^_decode_kernel$' -c 1 -o "$OUT_DIR/decode_$tag" \
          python3 benchmarks/bench_attention.py --regimes --fp8-kv --choices "$choice" \
          --points "${PROFILE_POINT:-64x4096}" > "$OUT_DIR/profile_$tag.log" 2>&1
        echo "profile $choice: rc=$?"
        ncu -i "$OUT_DIR/decode_$tag.ncu-rep" --page source --print-source sass --csv \
          > "$OUT_DIR/decode_${tag}_sass.csv"
        ncu -i "$OUT_DIR/decode_$tag.ncu-rep" --page details --csv > "$OUT_DIR/decode_${tag}_details.csv"
        rm -f "$OUT_DIR/decode_$tag.ncu-rep"  # tens of MB; the CSVs hold what the summary reads
      done
      python3 benchmarks/sass_mix.py "$OUT_DIR"/decode_*_sass.csv \
        --json-out "$OUT_DIR/decode_sass_mix.json" ;;
    profile-gemm)
      # The FP8 decode GEMM at a few rows, one launch profiled (the 6th: the first compile and
      # warm) for each projection and row count: where its warps stall, its SASS mix.
      for m in ${PROFILE_ROWS:-1 8}; do
        for proj in ${PROFILE_PROJECTIONS:-qkv down}; do
          tag="fp8_gemm_${proj}_m$m"
          timeout 120 ncu --set full -k regex:'^_decode_linear_kernel$' --launch-skip 5 -c 1 \
            -o "$OUT_DIR/$tag" python3 benchmarks/bench_gemm.py --shapes qwen3-8b --m "$m" \
            --profile-fp8 "$proj" > "$OUT_DIR/profile_$tag.log" 2>&1
          echo "profile $tag: rc=$?"
          ncu -i "$OUT_DIR/$tag.ncu-rep" --page source --print-source sass --csv \
            > "$OUT_DIR/${tag}_sass.csv"
          ncu -i "$OUT_DIR/$tag.ncu-rep" --page details --csv > "$OUT_DIR/${tag}_details.csv"
          rm -f "$OUT_DIR/$tag.ncu-rep"
        done
      done
      python3 benchmarks/sass_mix.py "$OUT_DIR"/fp8_gemm_*_sass.csv \
        --json-out "$OUT_DIR/fp8_gemm_sass_mix.json" ;;
    launch-floor)
      for m in ${FLOOR_ROWS:-1 8}; do
        LINES_SHOWN=10 run gemm_launch_floor_qwen3-8b_m$m 240 benchmarks/bench_gemm.py \
          --shapes qwen3-8b --m "$m" --launch-floor \
          --json-out "$OUT_DIR/gemm_launch_floor_qwen3-8b_m$m.json"
      done ;;
    routes-w8a8) LINES_SHOWN=16 run gemm_w8a8_routes_qwen3-8b 120 benchmarks/bench_gemm.py \
      --shapes qwen3-8b --w8a8-routes "${ROUTE_ROWS:-64,96,128}" \
      --json-out "$OUT_DIR/gemm_w8a8_routes_qwen3-8b.json" ;;
    attn-registers) LINES_SHOWN=12 run attention_regimes_fp8_kv_registers 120 \
      benchmarks/bench_attention.py --regimes --fp8-kv \
      --points "${REGISTER_POINTS:-32x5000,64x4096,96x1500}" \
      --choices "FP8 KV with fp8_full_batch_block_n=0;FP8 KV with fp8_full_batch_block_n=0,max_registers=96;FP8 KV with fp8_full_batch_block_n=0,max_registers=80;FP8 KV" \
      --json-out "$OUT_DIR/attention_regimes_fp8_kv_registers.json" ;;
    attn-crowded) LINES_SHOWN=14 attn crowded 240 "$CROWDED" \
      "bf16 KV;FP8 KV;FP8 KV with fp8_full_batch_block_n=0;FP8 KV with fp8_one_warp_min_pairs=128,fp8_one_warp_target_programs=1024" ;;
    attn-one-warp-registers) attn one_warp_registers 240 "$CROWDED" \
      "bf16 KV;FP8 KV;FP8 KV with fp8_one_warp_max_registers=128;FP8 KV with fp8_one_warp_max_registers=104;FP8 KV with fp8_full_batch_block_n=0;FP8 KV with fp8_one_warp_min_pairs=128,fp8_one_warp_target_programs=1024,fp8_one_warp_max_registers=128" ;;
    attn-one-warp-stages) attn one_warp_stages 300 "$CROWDED" \
      "bf16 KV;FP8 KV;FP8 KV with fp8_one_warp_num_stages=5;FP8 KV with fp8_one_warp_num_stages=7;FP8 KV with fp8_full_batch_block_n=0;FP8 KV with fp8_one_warp_min_pairs=128,fp8_one_warp_target_programs=1024" ;;
    attn-scales) LINES_SHOWN=20 attn scales 240 "${SCALES_POINTS:-1x15000,4x13000,8x10000,$GRPO_PAIRS}" \
      "bf16 KV;FP8 KV;FP8, scales by slot" ;;
    attn-merge-pairs) LINES_SHOWN=20 attn merge_pairs 300 "${MERGE_POINTS:-$GRPO_PAIRS}" \
      "bf16 KV;FP8 KV;FP8 KV with fp8_one_warp_merge_pairs=16;FP8 KV with fp8_one_warp_merge_pairs=8;FP8 KV with fp8_one_warp_merge_pairs=16,fp8_one_warp_target_programs=2048;FP8 KV with fp8_one_warp_merge_pairs=16,fp8_one_warp_min_pairs=128,fp8_one_warp_target_programs=2048" ;;
    attn-k-by-head) LINES_SHOWN=20 attn k_by_head 240 "${MERGE_POINTS:-$GRPO_PAIRS}" \
      "bf16 KV;FP8, K by slot;FP8 KV;FP8 KV with fp8_full_batch_block_n=0" ;;
    attn-k-by-head-tiles) LINES_SHOWN=20 attn k_by_head_tiles 300 \
      "${KHEAD_POINTS:-$GRPO_PAIRS,32x4000~,48x3000~,64x2500~,96x1500~}" \
      "bf16 KV;FP8, K by slot;FP8 KV;FP8 KV with fp8_full_batch_block_n=0;FP8 KV with fp8_full_batch_block_n=0,fp8_full_batch_split_len=1024" ;;
    attn-full-batch-tiles) LINES_SHOWN=20 attn full_batch_tiles 300 \
      "${FULL_BATCH_POINTS:-$GRPO_PAIRS}" \
      "bf16 KV;FP8 KV;FP8 KV with fp8_full_batch_block_n=256,fp8_full_batch_num_warps=4;FP8 KV with fp8_full_batch_block_n=256,fp8_full_batch_num_warps=8;FP8 KV with fp8_full_batch_block_n=64;FP8 KV with fp8_full_batch_block_n=64,fp8_full_batch_num_warps=2;FP8 KV with fp8_full_batch_block_n=128,fp8_full_batch_num_warps=2" ;;
    attn-tail-tiles) LINES_SHOWN=20 attn tail_tiles 240 \
      "${TAIL_POINTS:-1x15000,2x14000,3x14000,5x12500,8x10000,12x9000,16x8000,24x6000}" \
      "bf16 KV;FP8 KV;FP8 KV with block_n=64;FP8 KV with block_n=32;FP8 KV with split_len=1024" ;;
    attn-pages)
      for pages in ${PAGES:-32 64 128}; do
        LINES_SHOWN=16 run "attention_regimes_fp8_kv_pages_$pages" 150 benchmarks/bench_attention.py \
          --regimes --fp8-kv --block-size $pages --points "$GRPO_PAIRS" --choices "bf16 KV;FP8 KV" \
          --json-out "$OUT_DIR/attention_regimes_fp8_kv_pages_$pages.json"
      done ;;
    grpo-pages)
      for pages in ${GRPO_PAGES:-64}; do
        grpo_main "w8a8_head_input_pages_$pages" --engine block_size=$pages
      done ;;
    grpo-tiles)
      extra=()
      for field in ${GRPO_TILES:-}; do extra+=(--decode-tiles "$field"); done
      grpo_main "${GRPO_NAME:-tiles}" "${extra[@]}" ;;
    grpo-one-warp-merge)
      extra=()
      for field in ${ONE_WARP_EXTRA:-}; do extra+=(--decode-tiles "$field"); done
      grpo_main one_warp_merge --decode-tiles fp8_one_warp_merge_pairs=${ONE_WARP_MERGE_PAIRS:-16} \
        "${extra[@]}" ;;
    grpo-one-warp-stages) grpo_main one_warp_stages \
      --decode-tiles fp8_one_warp_num_stages=${ONE_WARP_STAGES:-5} ;;
    grpo-one-warp-registers) grpo_main one_warp_registers \
      --decode-tiles fp8_one_warp_max_registers=${ONE_WARP_REGISTERS:-128} ;;
    tail) both grpo_tail 120 --workload grpo --prompts 2 --group-size 4 --length-max 4096 ;;
    moe) run moe_experts 90 benchmarks/bench_moe.py --tokens ${MOE_TOKENS:-1,8,32,128} \
      --json-out "$OUT_DIR/moe_experts.json" ;;
    grpo-moe) both grpo_qwen3-30b-a3b 270 --workload grpo --shape qwen3-30b-a3b ${GRPO_MOE_ARGS:-} ;;
    drift)
      for s in ${DRIFT_SHAPES:-qwen3-8b qwen3-30b-a3b}; do
        run "drift_$s" 300 benchmarks/bench_mismatch.py --shape "$s" --weight-quantization fp8 \
          --samples ${SAMPLES:-4} --length ${LENGTH:-8192} --json-out "$OUT_DIR/drift_$s.json"
      done ;;
    gemm-w8a8)
      for m in ${W8A8_ROWS:-8 16 32 64 128}; do
        run "gemm_w8a8_qwen3-8b_m$m" ${GEMM_TIMEOUT:-150} benchmarks/bench_gemm.py --shapes qwen3-8b \
          --m $m --w8a8 --json-out "$OUT_DIR/gemm_w8a8_qwen3-8b_m$m.json"
      done ;;
    gemm-w8a8-narrow)
      for m in ${W8A8_ROWS:-1 8 32}; do
        run "gemm_w8a8_narrow_qwen3-8b_m$m" ${GEMM_TIMEOUT:-240} benchmarks/bench_gemm.py \
          --shapes qwen3-8b --m $m --w8a8 --w8a8-narrow \
          --json-out "$OUT_DIR/gemm_w8a8_narrow_qwen3-8b_m$m.json"
      done ;;
    drift-w8a8)
      for extra in "--activation-quantization fp8 --fp8-lm-head" ""; do
        tag=$([ -n "$extra" ] && echo w8a8_head || echo weights)
        # shellcheck disable=SC2086
        run "drift_${tag}_qwen3-8b" 300 benchmarks/bench_mismatch.py --shape qwen3-8b \
          --weight-quantization fp8 $extra --samples ${SAMPLES:-4} --length ${LENGTH:-4096} \
          --json-out "$OUT_DIR/drift_${tag}_qwen3-8b.json"
      done ;;
    drift-head) run drift_head_qwen3-8b 300 benchmarks/bench_mismatch.py --shape qwen3-8b \
      --weight-quantization fp8 --fp8-lm-head --samples ${SAMPLES:-4} --length ${LENGTH:-4096} \
      --json-out "$OUT_DIR/drift_head_qwen3-8b.json" ;;
    grpo-head) run grpo_qwen3-8b_fp8_kv_head 240 benchmarks/bench_rollout.py --workload grpo \
      --modes overlap --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
      --engine fp8_lm_head=true --json-out "$OUT_DIR/grpo_qwen3-8b_fp8_kv_head.json" \
      --plot-out "$PLOT_DIR/grpo_qwen3-8b_fp8_kv_head.png" ;;
    grpo-bf16) run grpo_qwen3-8b_bf16 300 benchmarks/bench_rollout.py --workload grpo --modes overlap \
      --json-out "$OUT_DIR/grpo_qwen3-8b_bf16.json" --plot-out "$PLOT_DIR/grpo_qwen3-8b_bf16.png" ;;
    grpo-w8a8)
      # shellcheck disable=SC2086
      run grpo_qwen3-8b_w8a8 300 benchmarks/bench_rollout.py --workload grpo --modes overlap \
        --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
        --engine activation_quantization=fp8 --engine fp8_lm_head=true ${GRPO_W8A8_EXTRA:-} \
        --json-out "$OUT_DIR/grpo_qwen3-8b_w8a8.json" --plot-out "$PLOT_DIR/grpo_qwen3-8b_w8a8.png" ;;
    grpo-one-warp-wide) grpo_main one_warp_wide --decode-tiles fp8_one_warp_min_pairs=128 \
      --decode-tiles fp8_one_warp_target_programs=1024 ;;
    grpo-w8a8-group) run grpo_qwen3-8b_w8a8_group 240 benchmarks/bench_rollout.py --workload grpo \
      --modes overlap --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 \
      --engine activation_quantization=fp8-group --engine fp8_lm_head=true \
      --json-out "$OUT_DIR/grpo_qwen3-8b_w8a8_group.json" \
      --plot-out "$PLOT_DIR/grpo_qwen3-8b_w8a8_group.png" ;;
    drift-head-input) run drift_w8a8_head_input_qwen3-8b 300 benchmarks/bench_mismatch.py \
      --shape qwen3-8b --weight-quantization fp8 --activation-quantization fp8 --fp8-lm-head \
      --fp8-lm-head-input --samples ${SAMPLES:-4} --length ${LENGTH:-4096} \
      --json-out "$OUT_DIR/drift_w8a8_head_input_qwen3-8b.json" ;;
    grpo-w8a8-head-input) grpo_main w8a8_head_input ;;
    drift-w8a8-group) run drift_w8a8_group_head_qwen3-8b 300 benchmarks/bench_mismatch.py \
      --shape qwen3-8b --weight-quantization fp8 --activation-quantization fp8-group \
      --fp8-lm-head --samples ${SAMPLES:-4} --length ${LENGTH:-4096} \
      --json-out "$OUT_DIR/drift_w8a8_group_head_qwen3-8b.json" ;;
    regimes-w8a8)
      for activations in none fp8 fp8-group; do
        LINES_SHOWN=8 run "decode_regimes_w8a8_$activations" 150 benchmarks/bench_decode_regimes.py \
          --steps 20 --points ${REGIME_POINTS:-1x2048,8x3000,32x3000,96x1500} \
          --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 --engine fp8_lm_head=true \
          --engine activation_quantization=$activations \
          --json-out "$OUT_DIR/decode_regimes_w8a8_$activations.json"
      done ;;
    regimes-main) LINES_SHOWN=8 regimes_main main --steps 20 \
      --points "${REGIME_POINTS:-1x2048,8x3000,32x3000,96x1500}" ;;
    grpo-qk-rope-off) grpo_main qk_rope_off --engine fused_qk_rope=false ;;
    grpo-bf16-qk-rope-off) run grpo_qwen3-8b_bf16_qk_rope_off 300 benchmarks/bench_rollout.py \
      --workload grpo --modes overlap --engine fused_qk_rope=false \
      --json-out "$OUT_DIR/grpo_qwen3-8b_bf16_qk_rope_off.json" \
      --plot-out "$PLOT_DIR/grpo_qwen3-8b_bf16_qk_rope_off.png" ;;
    regimes-qk-rope-off) LINES_SHOWN=8 regimes_main qk_rope_off --steps 20 \
      --points "${REGIME_POINTS:-1x2048,8x3000,32x3000,96x1500}" --engine fused_qk_rope=false ;;
    regimes-code)
      TORCH_LOGS=output_code LINES_SHOWN=4 regimes_main code --steps 5 --no-profile \
        --points "${CODE_POINTS:-8x10000}"
      for setting in fp8 bf16; do  # each generated kernel's heuristics beside its name
        awk '/^@triton_heuristics/ {p = 1} p {print} /^def triton_/ {p = 0}' \
          "$OUT_DIR/decode_regimes_code_$setting.log" > "$OUT_DIR/decode_regimes_code_${setting}_kernels.txt"
      done ;;
    regimes-e4m3)
      for rounding in conversion bits; do
        flag=()
        [ "$rounding" = bits ] && flag=(--e4m3-bits)
        LINES_SHOWN=8 run "decode_regimes_w8a8_e4m3_$rounding" 150 benchmarks/bench_decode_regimes.py \
          --steps 20 --points ${REGIME_POINTS:-1x2048,8x3000,32x3000,96x1500} \
          --engine weight_quantization=fp8 --engine kv_cache_dtype=fp8 --engine fp8_lm_head=true \
          --engine activation_quantization=fp8 "${flag[@]}" \
          --json-out "$OUT_DIR/decode_regimes_w8a8_e4m3_$rounding.json"
      done ;;
    *) echo "unknown part $part" ;;
  esac
done
