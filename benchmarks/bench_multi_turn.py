"""Multi-turn rollouts with slow tools against the same tokens in one turn: does the device stay
busy while tools run?

    python benchmarks/bench_multi_turn.py --smoke          # tiny model on CPU, seconds
    python benchmarks/bench_multi_turn.py --shape qwen3-8b --json-out out/multi_turn.json

Groups of G episodes (random-weight model, `benchmarks/lib/tool_env.py`): `--turns` model turns of
`--turn-tokens` each (EOS ignored), each but the last followed by a tool call that sleeps a
lognormal latency (`--latency-ms` median, `--latency-sigma`) and appends `--observation-tokens`.
The episodes run through the rollout worker's EpisodeRunner, as in training. The single-turn run
generates the same model tokens per sample in one request. Reported for each: model tokens/s,
wall time, the device-busy fraction (device time of the steps over wall time), steps, and for the
multi-turn run the tool time and the prefix-cache hits (the earlier turns' KV reused).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()


def _engine(model, args, tokenizer):
    from rollout import EngineConfig, LLMEngine

    total = args.prompt_len + args.turns * (args.turn_tokens + args.observation_tokens) + 16
    config = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        max_model_len=total,
        max_num_seqs=args.prompts * args.group_size,
        cuda_graphs=args.device == "cuda",
        compile_model=args.device == "cuda",
    )
    engine = LLMEngine.from_model(model, config, tokenizer=tokenizer)
    engine.measure_device_time()
    return engine


def run_single_turn(engine, prompts, args) -> dict:
    from rollout import SamplingParams

    params = SamplingParams(
        max_tokens=args.turns * args.turn_tokens, n=args.group_size, ignore_eos=True, seed=0
    )
    busy0, start = engine.stats().device_s, time.perf_counter()
    steps = 0
    for i, p in enumerate(prompts):
        engine.add_request(p, params, request_id=f"s{i}")
    tokens = 0
    while engine.has_unfinished():
        tokens += sum(len(c.token_ids) for c in engine.step())
        steps += 1
    return _result("single-turn", engine, tokens, steps, start, busy0)


def run_multi_turn(engine, prompts, args) -> dict:
    from rollout import SamplingParams
    from rollout.environments import EpisodeLimits
    from rollout.environments.episodes import EpisodeRunner

    wake = threading.Event()
    runner = EpisodeRunner(engine, wake=wake.set)
    limits = EpisodeLimits(
        max_turns=args.turns,
        max_tokens=args.turns * (args.turn_tokens + args.observation_tokens),
        tool_timeout_s=3600,
    )
    params = SamplingParams(max_tokens=args.turn_tokens, n=args.group_size, ignore_eos=True, seed=0)
    env = "benchmarks.lib.tool_env:SyntheticToolEnv"
    hits0 = engine.stats().prefix_hit_tokens
    busy0, start = engine.stats().device_s, time.perf_counter()
    for i, p in enumerate(prompts):
        runner.start(f"m{i}", env, {"prompt": " ".join(map(str, p))}, params, limits)
    episodes, steps = [], 0
    while len(episodes) < len(prompts) * args.group_size:
        runner.poll()
        episodes += runner.finished
        runner.finished = []
        if engine.has_unfinished():
            for c in engine.step():
                runner.on_completion(c)
            steps += 1
        else:  # every episode waits for its tool
            wake.wait(0.01)
            wake.clear()
    runner.shutdown()
    statuses = {e.status for e in episodes}
    if statuses != {"done"}:
        raise SystemExit(f"episodes ended with {statuses}: the benchmark's environment failed")
    tokens = sum(sum(e.completion_mask) for e in episodes)
    result = _result("multi-turn", engine, tokens, steps, start, busy0)
    result["tool_s_total"] = sum(sum(e.env.latencies) for e in episodes)
    result["prefix_hit_tokens"] = engine.stats().prefix_hit_tokens - hits0
    return result


def _result(mode, engine, tokens, steps, start, busy0) -> dict:
    import torch

    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    busy = engine.stats().device_s - busy0
    return {
        "mode": mode,
        "model_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "steps": steps,
        "device_busy": busy / wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, small numbers")
    parser.add_argument("--shape", default="qwen3-8b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=600)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=512)
    parser.add_argument("--observation-tokens", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=500.0, help="median tool latency")
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.prompts, args.group_size, args.prompt_len = "tiny", 2, 3, 12
        args.turns, args.turn_tokens, args.observation_tokens = 3, 8, 4
        args.latency_ms = min(args.latency_ms, 20.0)

    import torch

    from benchmarks.lib import tool_env
    from benchmarks.lib.report import commit_id
    from benchmarks.lib.workloads import SHAPES, build_model

    args.device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    shape = SHAPES[args.shape]
    vocab = min(16000, shape["vocab_size"])
    tool_env.SETTINGS.update(
        turns=args.turns, observation_tokens=args.observation_tokens, vocab=vocab,
        latency_median_s=args.latency_ms / 1e3, latency_sigma=args.latency_sigma, seed=args.seed,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model(shape, args.dtype, args.device)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [
        torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
        for _ in range(args.prompts)
    ]
    engine = _engine(model, args, tool_env.IdTokenizer())
    runs = []
    for run in (run_single_turn, run_multi_turn):
        engine.reset_prefix_cache()
        runs.append(run(engine, prompts, args))
        r = runs[-1]
        busy = f"{r['device_busy']:.1%}" if args.device == "cuda" else "-"
        print(
            f"[multi-turn] {r['mode']:11s}: {r['model_tokens']} model tokens in {r['wall_s']:.2f} s "
            f"({r['tokens_per_s']:,.0f} tok/s), {r['steps']} steps, device busy {busy}"
            + (f", tools {r['tool_s_total']:.1f} s in all, prefix hits {r['prefix_hit_tokens']}"
               if "tool_s_total" in r else ""),
            flush=True,
        )  # fmt: skip
    if runs[0]["model_tokens"] != runs[1]["model_tokens"]:
        raise SystemExit("the two runs generated different numbers of model tokens: a bug")
    if args.json_out:
        report = {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "date": datetime.date.today().isoformat(),
            "commit": commit_id(),
            "command": " ".join(sys.argv),
            "settings": {k: v for k, v in vars(args).items() if k != "json_out"},
            "runs": runs,
        }
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
