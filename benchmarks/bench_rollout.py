"""Rollout throughput benchmark: the engine's sync and overlap loops (and transformers) on one model.

    python benchmarks/bench_rollout.py --smoke                          # tiny model on CPU, seconds
    python benchmarks/bench_rollout.py --workload w1 --compare-transformers --json-out out/w1.json
    python benchmarks/bench_rollout.py --workload w3 --modes overlap

Workloads (random-init weights built on the device, EOS ignored, exactly N new tokens each):
  w1     Llama-3-8B shape, 32 x (256 prompt + 2048 new)
  w1-8k  the same with 8192 new tokens
  w3     Qwen2.5-0.5B shape, 256 x (256 + 1024)
  long   Llama-3-8B shape, 64 x (512 + 16384)
  gpt-oss-20b  gpt-oss-20b shape (MoE, alternating 128-token windows, sinks), 32 x (256 + 1024)
  smoke  a tiny model on CPU

Per run: tokens/s, ms/step, GPU-busy fraction (device time of each step's compute over wall time),
host CPU time per step, the bandwidth roofline and the fraction reached, peak memory. Writes JSON
(a top-level "runs" list) and a PNG (throughput per mode, step time over the run).
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

from rollout.environment import set_environment_defaults  # noqa: E402

set_environment_defaults()


def run_engine(model, workload, overlap: bool, prompts, args) -> dict:
    import torch

    from benchmarks.lib.roofline import (
        kv_bytes_per_token,
        roofline_tokens_per_s,
        weight_bytes_per_step,
    )
    from rollout import EngineConfig, LLMEngine, SamplingParams
    from rollout.engine.execution.device_timing import DeviceTiming

    settings = dict(
        device=workload.device,
        dtype=workload.dtype,
        max_model_len=workload.max_model_len,
        max_num_seqs=max(workload.num_requests, 1),
        max_num_batched_tokens=args.max_num_batched_tokens,
        overlap=overlap,
        cuda_graphs=not args.no_cuda_graphs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        compile_model=not args.no_compile,
    )
    settings.update(workload.engine)
    settings.update(args.engine_overrides)
    setup_start = time.perf_counter()
    engine = LLMEngine.from_model(model, EngineConfig(**settings))
    params = SamplingParams(
        max_tokens=workload.new_tokens, temperature=args.temperature, ignore_eos=True, seed=0
    )
    # Warm-up: compiles kernels and captures the decode graphs of this batch size.
    engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, seed=1))
    cuda = engine.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    setup_s = time.perf_counter() - setup_start
    engine.runner.timing = DeviceTiming(engine.device)
    engine.runner.host_wait_s = 0.0
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=f"r{i}", first_index=i)
    step_ends, tokens = [], 0
    start = time.perf_counter()
    last_report = 0.0
    while engine.has_unfinished():
        for completion in engine.step():
            tokens += len(completion.token_ids)
        step_ends.append(time.perf_counter() - start)
        if step_ends[-1] - last_report > 60:  # long workloads: show progress
            last_report = step_ends[-1]
            done = tokens + sum(s.num_output_tokens for s in engine.scheduler.running)
            print(
                f"[bench]   ... {step_ends[-1]:.0f} s, {len(step_ends)} steps, ~{done:,} tokens, "
                f"{len(engine.scheduler.running)} running, "
                f"{engine.scheduler.num_preemptions} preemptions",
                flush=True,
            )
        if args.deadline_s and step_ends[-1] > args.deadline_s:
            break
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if args.deadline_s and wall > args.deadline_s and engine.has_unfinished():
        tokens = sum(s.num_output_tokens for s in engine.scheduler.running)  # all still running
    device_s = engine.runner.timing.total_s()
    steps = len(step_ends)
    weights = weight_bytes_per_step(model)
    roofline = roofline_tokens_per_s(
        weights,
        kv_bytes_per_token(model.config, engine.runner.kv_caches[0][0].element_size()),
        workload.num_requests,
        workload.prompt_len,
        workload.new_tokens,
        windows=engine.runner.windows,
    )
    tokens_per_s = tokens / wall
    step_ms = [1e3 * (b - a) for a, b in zip([0.0, *step_ends[:-1]], step_ends, strict=True)]
    result = {
        "mode": "overlap" if overlap else "sync",
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens_per_s,
        "steps": steps,
        "ms_per_step": 1e3 * wall / steps,
        "gpu_busy": device_s / wall if cuda else None,
        "cpu_ms_per_step": 1e3 * (wall - engine.runner.host_wait_s) / steps,
        "roofline_tokens_per_s": roofline if cuda else None,
        "roofline_fraction": tokens_per_s / roofline if cuda else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "num_kv_blocks": engine.num_kv_blocks,
        "preemptions": engine.scheduler.num_preemptions,
        "cuda_graphs": len(engine.runner.graphs) if engine.runner.graphs is not None else 0,
        "truncated_at_deadline": bool(args.deadline_s and engine.has_unfinished()),
        "setup_s": setup_s,
        "compiled": settings["compile_model"] and cuda,
        "step_ms": step_ms,
    }
    if args.profile_steps and cuda:
        from benchmarks.lib.kernel_profile import profile_decode

        result["profile"] = profile_decode(engine, prompts, args.profile_steps)
    del engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> None:
    from benchmarks.lib.report import plot_runs, print_run, print_table

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="w1", help="w1, w1-8k, w3, long, smoke, gpu-smoke")
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
    parser.add_argument("--profile-steps", type=int, default=0, help="kernel profile of N steps")
    parser.add_argument("--deadline-s", type=float, default=0.0, help="stop each run after this")
    parser.add_argument("--json-out", default="")
    parser.add_argument("--plot-out", default="", help="PNG path (default: next to --json-out)")
    args = parser.parse_args(argv)
    args.engine_overrides = _engine_overrides(args.engine)

    import torch

    from benchmarks.lib.workloads import WORKLOADS, build_model

    name = "smoke" if args.smoke else args.workload
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    workload = WORKLOADS[name]
    if workload.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"workload {name} needs a CUDA device; try --smoke on CPU")
    torch.manual_seed(0)
    model = build_model(workload.model, workload.dtype, workload.device)
    g = torch.Generator().manual_seed(0)
    vocab = min(16000, workload.model["vocab_size"])
    prompts = [
        torch.randint(0, vocab, (workload.prompt_len,), generator=g).tolist()
        for _ in range(workload.num_requests)
    ]
    runs = []
    for mode in [m for m in args.modes.split(",") if m]:
        print(f"[bench] {name}: engine {mode} ...", flush=True)
        runs.append(run_engine(model, workload, mode == "overlap", prompts, args))
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

    report = {
        "workload": name,
        "shape": workload.model,
        "num_requests": workload.num_requests,
        "prompt_len": workload.prompt_len,
        "new_tokens": workload.new_tokens,
        "device": torch.cuda.get_device_name() if workload.device == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "commit": commit_id(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "runs": runs,
    }
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
