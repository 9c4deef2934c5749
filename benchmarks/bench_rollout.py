"""Rollout throughput benchmark: the engine's sync and overlap loops (and transformers) on one model.

    python benchmarks/bench_rollout.py --smoke                          # tiny model on CPU, seconds
    python benchmarks/bench_rollout.py --workload w1 --compare-transformers --json-out out/w1.json
    python benchmarks/bench_rollout.py --workload w3 --modes overlap
    python benchmarks/bench_rollout.py --workload grpo --shape qwen3-30b-a3b --json-out out/g.json
    python benchmarks/bench_rollout.py --workload grpo-smoke            # the grpo mix on CPU

Workloads (random-init weights built on the device, EOS ignored, exactly N new tokens each):
  w1     Llama-3-8B shape, 32 x (256 prompt + 2048 new)
  w1-8k  the same with 8192 new tokens
  w3     Qwen2.5-0.5B shape, 256 x (256 + 1024)
  long   Llama-3-8B shape, 64 x (512 + 16384)
  gpt-oss-20b  gpt-oss-20b shape (MoE, alternating 128-token windows, sinks), 32 x (256 + 1024)
  qwen3-30b-a3b      Qwen3-30B-A3B shape (MoE, 128 experts, top-8), 32 x (256 + 1024)
  qwen3-30b-a3b-128  the same with 128 requests
  qwen3-8b-w1        Qwen3-8B shape, 32 x (256 + 2048)
  smoke  a tiny model on CPU
  grpo   RL-shaped: --prompts prompts (16), each one request of n = --group-size samples (8)
         sharing its KV blocks, --prompt-len tokens (600) each, on --shape (qwen3-8b; a key of
         workloads.SHAPES). Each sample's length is fixed in advance: a lognormal draw of median
         --length-median (2048) and sigma --length-sigma (1.0), clipped to [--length-min (256),
         --length-max (16384)], rounded, seeded by --length-seed (0). So most samples end early
         and a few long ones decode in a small batch for a long tail, as in a GRPO rollout.
  grpo-smoke  the grpo mix on CPU: tiny model, fp32, 4 prompts x 4 samples, prompt 16, lengths
         median 24, sigma 0.8, in [8, 64]; the grpo flags override it too

Per run: tokens/s, ms/step, GPU-busy fraction (device time of each step's compute over wall time),
host CPU time per step, the bandwidth roofline and the fraction reached, peak memory; for MoE
shapes also the roofline counting only the experts a step is expected to touch. A grpo run adds
the per-step bandwidth floor of its lengths (floor_s, floor_fraction: floor_s over the measured
wall time of the whole run, prefill included, which the floor leaves out), the time per regime of
running samples (1-3, 4-7, 8-15, 16-63, 64+), the tail (steps with fewer than 8 running), and the
peak KV blocks in use against one copy of the prompt per sample. Writes JSON (a top-level "runs"
list) and a PNG (throughput per mode, step time over the run).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()


def run_engine(model, workload, overlap: bool, prompts, args) -> dict:
    import torch

    from benchmarks.lib.roofline import (
        engine_kv_bytes_per_token,
        engine_step_floor,
        floor_bandwidth,
        roofline_tokens_per_s,
        weight_bytes_per_step,
        weight_split,
    )
    from rollout import EngineConfig, LLMEngine, SamplingParams
    from rollout.engine.model.capabilities import layer_windows

    settings = _engine_settings(workload, overlap, args, max(workload.num_requests, 1))
    setup_start = time.perf_counter()
    engine = LLMEngine.from_model(model, EngineConfig(**settings))
    params = SamplingParams(
        max_tokens=workload.new_tokens, temperature=args.temperature, ignore_eos=True, seed=0
    )
    # Warm-up: compiles kernels and captures the decode graphs of this batch size.
    engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, seed=1))
    _ready_for_the_measured_run(engine)
    setup_s = time.perf_counter() - setup_start
    cuda = engine.device.type == "cuda"
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=f"r{i}", first_index=i)
    tokens = 0
    clock = _RunClock(args.deadline_s)
    while engine.has_unfinished():
        for completion in engine.step():
            tokens += len(completion.token_ids)
        if clock.step_done(engine, lambda n=tokens: f"{n:,} tokens in finished samples"):
            break
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - clock.start
    stats = engine.stats()
    if args.deadline_s and wall > args.deadline_s and engine.has_unfinished():
        tokens = stats.running_output_tokens  # all still running
    step_ends = clock.step_ends
    steps = len(step_ends)
    weights = weight_bytes_per_step(model)
    kv_per_token = engine_kv_bytes_per_token(engine)
    roofline = roofline_tokens_per_s(
        weights,
        kv_per_token,
        workload.num_requests,
        workload.prompt_len,
        workload.new_tokens,
        bandwidth=floor_bandwidth(engine.device)[0],
        windows=layer_windows(engine.model),
    )
    tokens_per_s = tokens / wall
    step_ms = [1e3 * (b - a) for a, b in zip([0.0, *step_ends[:-1]], step_ends, strict=True)]
    result = _run_result(
        engine, overlap, tokens, wall, steps, roofline, setup_s, settings,
        truncated=bool(args.deadline_s and engine.has_unfinished()), step_ms=step_ms,
    )  # fmt: skip
    split = weight_split(model)
    if split.num_experts:
        # roofline_tokens_per_s above counts every expert (its numbers stay comparable with older
        # runs); this one counts the experts the batch's tokens are expected to touch.
        _, touched_s = engine_step_floor(
            model, engine, workload.prompt_len, [workload.new_tokens] * workload.num_requests
        )
        touched = workload.num_requests * workload.new_tokens / touched_s
        result["touched_expert_roofline_tokens_per_s"] = touched if cuda else None
        result["touched_expert_roofline_fraction"] = tokens_per_s / touched if cuda else None
    _profile(engine, prompts, args, result)
    del engine
    _release_memory(cuda)
    return result


def _ready_for_the_measured_run(engine) -> None:
    """After the warm-up: the device idle, and every count and timer from zero. The prefix cache
    is emptied too, so the run prefills its prompts in full as a run of new prompts does: with
    the warm-up's blocks still cached its first step would be a one-token-a-prompt extend, a
    shape the warm-up did not compile (seconds of compilation timed as the first step)."""
    import torch

    engine.reset_prefix_cache()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    engine.measure_device_time()
    engine.reset_stats()


def _run_result(
    engine, overlap, tokens, wall, steps, roofline, setup_s, settings, truncated, step_ms
) -> dict:
    """What every engine run reports (both workload kinds)."""
    import torch

    from benchmarks.lib.roofline import floor_bandwidth

    cuda = engine.device.type == "cuda"
    stats = engine.stats()
    tokens_per_s = tokens / wall
    bandwidth, bandwidth_is = floor_bandwidth(engine.device)
    return {
        "mode": "overlap" if overlap else "sync",
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens_per_s,
        "steps": steps,
        "ms_per_step": 1e3 * wall / steps,
        "gpu_busy": stats.device_s / wall if cuda else None,
        "cpu_ms_per_step": 1e3 * (wall - stats.host_wait_s) / steps,
        "roofline_tokens_per_s": roofline if cuda else None,
        "roofline_fraction": tokens_per_s / roofline if cuda else None,
        # what the roofline and floors divide by
        "floor_bandwidth": bandwidth if cuda else None,
        "floor_bandwidth_is": bandwidth_is if cuda else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "num_kv_blocks": engine.num_kv_blocks,
        "preemptions": stats.preemptions,
        # Prompt tokens whose KV the prefix cache supplied (0 unless prompts repeat in the run).
        "prefix_hit_tokens": stats.prefix_hit_tokens,
        "cuda_graphs": stats.cuda_graphs,
        "fp8_round_s": stats.fp8_round_s,  # rounding every weight to FP8 once (at load)
        "truncated_at_deadline": truncated,
        "setup_s": setup_s,
        "compiled": settings["compile_model"] and cuda,
        # 0.1 us is finer than the host clock resolves a step; more digits only grow the file
        "step_ms": [round(ms, 4) for ms in step_ms],
        "speculation": _speculation(engine, stats.speculation),
    }


def _speculation(engine, stats) -> dict | None:
    """What speculative decoding did in the measured run (None when it is off)."""
    if engine.config.speculative == "none":
        return None
    return {
        "verifications": stats.verifications,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "emitted": stats.emitted,
        "acceptance_rate": stats.accepted / stats.drafted if stats.drafted else 0.0,
        "tokens_per_verification": (
            stats.emitted / stats.verifications if stats.verifications else 0.0
        ),
    }


class _RunClock:
    """A measured run's step end times (seconds from its start), a progress line each minute on
    long workloads, and the optional deadline."""

    def __init__(self, deadline_s: float | None) -> None:
        self.deadline_s = deadline_s
        self.step_ends: list[float] = []
        self.start = time.perf_counter()
        self._last_report = 0.0

    def step_done(self, engine, done) -> bool:
        """Record a step's end (`done()`: what the run has finished so far, for the progress
        line; called only when a line is due). Returns whether the deadline has passed."""
        now = time.perf_counter() - self.start
        self.step_ends.append(now)
        if now - self._last_report > 60:
            self._last_report = now
            stats = engine.stats()
            print(
                f"[bench]   ... {now:.0f} s, {len(self.step_ends)} steps, {done()}; "
                f"{stats.running_sequences} running (~{stats.running_output_tokens:,} tokens), "
                f"{stats.preemptions} preemptions",
                flush=True,
            )
        return bool(self.deadline_s) and now > self.deadline_s


# Regimes of a grpo run by the number of samples running: (name, fewest, most; None: no bound).
# "0" holds steps that began with nothing running: the first, which admits the prompts.
REGIMES = (
    ("0", 0, 0),
    ("1-3", 1, 3),
    ("4-7", 4, 7),
    ("8-15", 8, 15),
    ("16-63", 16, 63),
    ("64+", 64, None),
)
TAIL_BELOW = 8  # a step with fewer samples running than this is part of the tail


class LengthPlan:
    """Ends every sample of a grpo run at its planned length.

    A request has one max_tokens for all its samples, so the requests go in with their group's
    longest length and each sample's own limit is written into the scheduler's sequence
    (`token_limit`: prompt + its length) when it first shows up among the running sequences: a
    request's first sample at admission, the others when they are forked off it after the
    prompt's prefill. `apply()` runs before every step; once every sample is set it does nothing.
    """

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.lengths: dict[tuple[str, int], int] = {}  # (request_id, sample_index) -> new tokens
        self.first_index: dict[str, int] = {}  # request_id -> its first sample's output index
        self.done: set[int] = set()  # seq ids already set

    def add(self, request_id: str, first_index: int, lengths: list[int]) -> None:
        self.first_index[request_id] = first_index
        self.lengths.update({(request_id, j): n for j, n in enumerate(lengths)})

    def apply(self) -> None:
        if len(self.done) == len(self.lengths):
            return
        for seq in self.scheduler.running:
            if seq.seq_id in self.done:
                continue
            length = self.lengths[(seq.request_id, seq.sample_index)]
            limit = seq.num_prompt_tokens + length
            if seq.num_tokens > limit:
                raise RuntimeError(
                    f"sample {seq.sample_index} of {seq.request_id} is planned for {length} new "
                    f"tokens but already has {seq.num_output_tokens} when it first runs"
                )
            seq.token_limit = limit
            self.done.add(seq.seq_id)

    def check(self, completions, expect_all: bool) -> None:
        """Every completion has exactly its planned number of tokens and, unless the run was cut
        short, every sample completed."""
        wrong = []
        for c in completions:
            sample = c.index - self.first_index[c.request_id]
            planned = self.lengths.get((c.request_id, sample))
            if len(c.token_ids) != planned or c.finish_reason != "length":
                wrong.append(
                    f"{c.request_id} sample {sample}: {len(c.token_ids)} tokens "
                    f"({c.finish_reason}{', ' + c.error if c.error else ''}), planned {planned}"
                )
        if wrong:
            raise AssertionError(
                f"{len(wrong)} of {len(completions)} samples did not end at their planned "
                f"length (the per-sample token_limit did not hold): {'; '.join(wrong[:5])}"
            )
        if expect_all and len(completions) != len(self.lengths):
            raise AssertionError(
                f"{len(completions)} completions for {len(self.lengths)} planned samples"
            )


def run_grpo(model, workload, overlap: bool, prompts, args) -> dict:
    """One engine run of a grpo workload: each prompt one request of n = group_size samples, each
    sample ending at its planned length; times every step and buckets it by samples running."""
    import numpy as np
    import torch

    from benchmarks.lib.roofline import engine_step_floor, running_per_step
    from rollout import EngineConfig, LLMEngine

    group = workload.group_size
    lengths = workload.sample_lengths()
    settings = _engine_settings(workload, overlap, args, workload.num_samples)
    setup_start = time.perf_counter()
    engine = LLMEngine.from_model(model, EngineConfig(**settings))
    # Warm-up through every batch size the run will see (graphs are captured per size, and a
    # capture inside the measured tail would be timed as tail).
    warmup = [min(n, workload.length_max) for n in _warmup_lengths(workload.num_samples)]
    _run_planned(engine, prompts, group, warmup, "w", args.temperature, seed=1)
    _ready_for_the_measured_run(engine)
    setup_s = time.perf_counter() - setup_start
    cuda = engine.device.type == "cuda"

    plan = _add_planned(engine, prompts, group, lengths, "r", args.temperature, seed=0)
    # The running samples, read every step (stats() would build a snapshot each time).
    internals = engine.debug_internals()
    scheduler, block_manager = internals.scheduler, internals.block_manager
    block_size = engine.config.block_size
    running_before, completions = [], []
    peak_blocks = peak_one_copy = 0

    clock = _RunClock(args.deadline_s)
    while engine.has_unfinished():
        plan.apply()
        running_before.append(len(scheduler.running))
        completions.extend(engine.step())
        # Blocks in use against one private copy of every running sample's tokens: what sharing
        # the prompt's blocks saves. O(running) per step, a few microseconds per hundred samples.
        peak_blocks = max(peak_blocks, engine.num_kv_blocks - block_manager.num_free_blocks)
        one_copy = sum(-(-seq.num_tokens // block_size) for seq in scheduler.running)
        peak_one_copy = max(peak_one_copy, one_copy)
        if clock.step_done(engine, lambda: f"{len(completions)} of {len(lengths)} samples done"):
            break
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - clock.start
    truncated = bool(args.deadline_s and engine.has_unfinished())
    plan.check(completions, expect_all=not truncated)
    tokens = sum(len(c.token_ids) for c in completions)
    if truncated:
        tokens += engine.stats().running_output_tokens
    step_ends = clock.step_ends
    steps = len(step_ends)
    step_s = np.diff(np.asarray([0.0, *step_ends]))

    floor_steps, floor_s = engine_step_floor(model, engine, workload.prompt_len, lengths)
    measured_running = np.asarray(running_before)
    floor_running = running_per_step(lengths)
    regimes = {}
    for name, low, high in REGIMES:
        measured = _in_regime(measured_running, low, high)
        floor = _in_regime(floor_running, low, high)
        regimes[name] = {
            "steps": int(measured.sum()),
            "ms_per_step_median": _median_ms(step_s[measured]),
            "total_s": float(step_s[measured].sum()),
            "floor_steps": int(floor.sum()),
            "floor_ms_per_step_median": _median_ms(floor_steps[floor]) if cuda else None,
            "floor_total_s": float(floor_steps[floor].sum()) if cuda else None,
        }
    # The tail: steps with a few samples left, once the run has started (the first step begins
    # with nothing running yet).
    tail = (measured_running > 0) & (measured_running < TAIL_BELOW)
    tail_s = float(step_s[tail].sum())
    planned = int(sum(lengths))
    roofline = planned / floor_s
    # For grpo the roofline is the per-step floor of its own lengths (touched experts only).
    result = _run_result(
        engine, overlap, tokens, wall, steps, roofline, setup_s, settings,
        truncated=truncated, step_ms=(1e3 * step_s).tolist(),
    )  # fmt: skip
    result |= {
        "lengths": {
            "min": int(min(lengths)),
            "median": float(np.median(lengths)),
            "p90": float(np.percentile(lengths, 90)),
            "max": int(max(lengths)),
            "total": planned,
        },
        # The floor covers the decode steps only; the measured wall time is the whole run's,
        # prefill included, so the fraction is what the run reached of the decode floor.
        "floor_s": floor_s if cuda else None,
        "floor_fraction": floor_s / wall if cuda else None,
        "floor_steps": len(floor_steps),
        "regimes": regimes,
        "tail_s": tail_s,
        "tail_share": tail_s / wall,
        "tail_steps": int(tail.sum()),
        "kv_blocks_peak": peak_blocks,
        "kv_blocks_one_copy_peak": peak_one_copy,
        "kv_blocks_ratio": peak_blocks / peak_one_copy if peak_one_copy else None,
    }
    _profile(engine, prompts, args, result)
    del engine
    _release_memory(cuda)
    return result


def _add_planned(engine, prompts, group: int, lengths, prefix: str, temperature, seed):
    """Queue each prompt as one request of `group` samples sharing its blocks; returns the plan
    that ends sample j of prompt i at lengths[i * group + j] new tokens."""
    from rollout import SamplingParams

    plan = LengthPlan(engine.debug_internals().scheduler)
    for i, prompt in enumerate(prompts):
        group_lengths = lengths[i * group : (i + 1) * group]
        params = SamplingParams(
            n=group,
            max_tokens=max(group_lengths),  # the group's longest; the others end by the plan
            temperature=temperature,
            ignore_eos=True,
            seed=seed,
        )
        request_id = engine.add_request(
            prompt, params, request_id=f"{prefix}{i}", first_index=i * group
        )
        plan.add(request_id, i * group, group_lengths)
    return plan


def _run_planned(engine, prompts, group: int, lengths, prefix: str, temperature, seed) -> None:
    plan = _add_planned(engine, prompts, group, lengths, prefix, temperature, seed)
    completions = []
    while engine.has_unfinished():
        plan.apply()
        completions.extend(engine.step())
    plan.check(completions, expect_all=True)


def _warmup_lengths(num_samples: int) -> list[int]:
    """Warm-up lengths under which the running batch takes every size from num_samples down to
    1 (sizes up to 64 one by one, larger ones in steps of 8: graph sizes are that far apart)."""
    sizes = set(range(1, min(num_samples, 64) + 1)) | set(range(64, num_samples + 1, 8))
    sizes.add(num_samples)
    # The sample of rank r runs while the batch is larger than r; 1 more: the prefill's token.
    return [1 + sum(1 for size in sizes if size > rank) for rank in range(num_samples)]


def _in_regime(running, low: int, high: int | None):
    return (running >= low) & (running <= high if high is not None else True)


def _median_ms(seconds) -> float | None:
    import numpy as np

    return 1e3 * float(np.median(seconds)) if len(seconds) else None


def _engine_settings(workload, overlap: bool, args, max_num_seqs: int) -> dict:
    settings = dict(
        device=workload.device,
        dtype=workload.dtype,
        max_model_len=workload.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        overlap=overlap,
        cuda_graphs=not args.no_cuda_graphs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        compile_model=not args.no_compile,
    )
    settings.update(workload.engine)
    settings.update(args.engine_overrides)
    return settings


def _profile(engine, prompts, args, result: dict) -> None:
    if args.profile_steps and engine.device.type == "cuda":
        from benchmarks.lib.kernel_profile import profile_decode

        result["profile"] = profile_decode(engine, prompts, args.profile_steps)


def _release_memory(cuda: bool) -> None:
    """After the caller dropped its engine: free it now, before the next run sizes its cache."""
    import torch

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    from benchmarks.lib.report import plot_runs, print_run, print_table
    from benchmarks.lib.workloads import GRPO_WORKLOADS, GrpoWorkload, build_model

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workload",
        default="w1",
        help="w1, w1-8k, w3, long, gpt-oss-20b, qwen3-30b-a3b(-128), qwen3-8b-w1, smoke, "
        "gpu-smoke, grpo, grpo-smoke",
    )
    parser.add_argument("--smoke", action="store_true", help="same as --workload smoke")
    parser.add_argument("--modes", default="sync,overlap")
    parser.add_argument("--compare-transformers", action="store_true")
    parser.add_argument("--transformers-modes", default="async,sync")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="eager decoder layers")
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an EngineConfig override for the engine runs, e.g. --engine triton_linear=false",
    )
    parser.add_argument(
        "--fp8-kv-tiles",
        choices=("fp16-k", "bf16"),
        default=None,
        help="what a bf16 model widens an FP8 KV cache's K tiles to (default: the engine's, fp16-k)",
    )
    parser.add_argument(
        "--decode-tiles",
        action="append",
        default=[],
        metavar="KEY=INT",
        help="a field of the decode attention's launch shape (DecodeTiles) for the engine runs, "
        "e.g. fp8_full_batch_split_len=1024",
    )
    parser.add_argument("--profile-steps", type=int, default=0, help="kernel profile of N steps")
    parser.add_argument("--deadline-s", type=float, default=0.0, help="stop each run after this")
    parser.add_argument("--json-out", default="")
    parser.add_argument("--plot-out", default="", help="PNG path (default: next to --json-out)")
    grpo = parser.add_argument_group(
        "grpo workloads", "an unset flag keeps the preset's value (grpo's in brackets)"
    )
    for flag, kind, field in GRPO_FLAGS:
        grpo.add_argument(
            flag, type=kind, default=None, help=f"[{getattr(GRPO_WORKLOADS['grpo'], field)}]"
        )
    args = parser.parse_args(argv)
    args.engine_overrides = _engine_overrides(args.engine)
    args.decode_tiles_used = None
    if args.decode_tiles:
        from benchmarks.lib.decode_tiles import set_decode_tiles

        args.decode_tiles_used = set_decode_tiles(args.decode_tiles)
    if args.fp8_kv_tiles:
        from rollout.kernels import triton_attention_tiles

        triton_attention_tiles.FP8_KV_TILES = args.fp8_kv_tiles.replace("-k", " K")

    import torch

    name = "smoke" if args.smoke else args.workload
    workload = _resolve_workload(name, args)
    is_grpo = isinstance(workload, GrpoWorkload)
    if args.compare_transformers and is_grpo:
        raise SystemExit("--compare-transformers: transformers has no per-sample lengths for grpo")
    if workload.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"workload {name} needs a CUDA device; try --smoke on CPU")
    from benchmarks.lib.roofline import floor_bandwidth

    floor_bandwidth(workload.device)  # measured (off an H200) before the model takes the memory
    torch.manual_seed(0)
    model = build_model(workload.model, workload.dtype, workload.device)
    g = torch.Generator().manual_seed(0)
    vocab = min(16000, workload.model["vocab_size"])
    prompts = [
        torch.randint(0, vocab, (workload.prompt_len,), generator=g).tolist()
        for _ in range(workload.num_prompts if is_grpo else workload.num_requests)
    ]
    run = run_grpo if is_grpo else run_engine
    runs = []
    for mode in [m for m in args.modes.split(",") if m]:
        print(f"[bench] {name}: engine {mode} ...", flush=True)
        runs.append(run(model, workload, mode == "overlap", prompts, args))
        print_run(runs[-1])
        _write_report(args, name, workload, runs)
    if args.compare_transformers:
        from benchmarks.lib.transformers_baseline import run_transformers_cb

        # A fresh model with the same weights: the engine switched the first one's attention and
        # compiled its layers in place, which would slow transformers' own path down.
        del model
        gc.collect()
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        model = build_model(workload.model, workload.dtype, workload.device)
        for mode in [m for m in args.transformers_modes.split(",") if m]:
            print(f"[bench] {name}: transformers {mode} ...", flush=True)
            try:
                runs.append(
                    run_transformers_cb(
                        model, prompts, workload.new_tokens, mode == "async", args.deadline_s
                    )
                )
                print_run(runs[-1])
                _write_report(args, name, workload, runs)
            except Exception as err:  # noqa: BLE001 - the baseline must not sink our numbers
                runs.append(
                    {"mode": f"transformers-{mode}", "error": f"{type(err).__name__}: {err}"}
                )
                print(f"[bench] transformers {mode} failed: {err}", flush=True)
    report = _write_report(args, name, workload, runs)
    print_table(report)
    if args.json_out:
        plot_path = (
            Path(args.plot_out) if args.plot_out else Path(args.json_out).with_suffix(".png")
        )
        plot_runs(
            [r for r in runs if "tokens_per_s" in r], f"{name} on {report['device']}", plot_path
        )


# The grpo flags: (flag, type, the GrpoWorkload field it sets).
GRPO_FLAGS = (
    ("--shape", str, "shape"),
    ("--prompts", int, "num_prompts"),
    ("--group-size", int, "group_size"),
    ("--prompt-len", int, "prompt_len"),
    ("--length-median", int, "length_median"),
    ("--length-sigma", float, "length_sigma"),
    ("--length-min", int, "length_min"),
    ("--length-max", int, "length_max"),
    ("--length-seed", int, "length_seed"),
)


def _resolve_workload(name: str, args):
    """The preset of that name; for a grpo preset, with the grpo flags that were given applied
    (they default to None, so the preset's own values stand, grpo-smoke's included)."""
    import dataclasses

    from benchmarks.lib.workloads import GRPO_WORKLOADS, WORKLOADS

    given = {
        flag: (field, getattr(args, flag[2:].replace("-", "_")))
        for flag, _, field in GRPO_FLAGS
        if getattr(args, flag[2:].replace("-", "_")) is not None
    }
    if name in GRPO_WORKLOADS:
        try:
            return dataclasses.replace(GRPO_WORKLOADS[name], **dict(given.values()))
        except ValueError as err:
            raise SystemExit(f"{name}: {err}") from err
    if name not in WORKLOADS:
        raise SystemExit(
            f"unknown workload {name!r}; choose from {sorted([*WORKLOADS, *GRPO_WORKLOADS])}"
        )
    if given:
        raise SystemExit(f"{', '.join(given)}: only for the grpo workloads, not {name}")
    return WORKLOADS[name]


def _engine_overrides(items: list[str]) -> dict:
    import yaml

    from rollout import EngineConfig

    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--engine takes KEY=VALUE; got {item!r}")
        overrides[key] = yaml.safe_load(value)
    try:
        EngineConfig.from_dict(overrides)  # unknown keys and bad values fail before any work
    except (TypeError, ValueError) as err:
        raise SystemExit(f"--engine: {err}") from err
    return overrides


def _write_report(args, name: str, workload, runs: list[dict]) -> dict:
    """The report so far; written to --json-out after every run (a time-out keeps what finished)."""
    import torch

    from benchmarks.lib.report import commit_id
    from benchmarks.lib.workloads import GrpoWorkload

    if isinstance(workload, GrpoWorkload):  # grpo: one request per prompt, lengths per sample
        mix = {
            "shape_name": workload.shape,
            "num_requests": workload.num_prompts,
            "group_size": workload.group_size,
            "prompt_len": workload.prompt_len,
            "new_tokens": None,
            "length_distribution": {
                "median": workload.length_median,
                "sigma": workload.length_sigma,
                "min": workload.length_min,
                "max": workload.length_max,
                "seed": workload.length_seed,
            },
        }
    else:
        mix = {
            "num_requests": workload.num_requests,
            "prompt_len": workload.prompt_len,
            "new_tokens": workload.new_tokens,
        }
    report = {
        "workload": name,
        "shape": workload.model,
        **mix,
        "device": torch.cuda.get_device_name() if workload.device == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "commit": commit_id(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "decode_tiles": args.decode_tiles_used,
        "runs": runs,
    }
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
