"""The rollout/trainer mismatch by position: the engine's logprobs against a trainer's forward.

    python benchmarks/bench_mismatch.py --shape qwen3-8b --json-out out/mismatch_8b.json
    python benchmarks/bench_mismatch.py --shape qwen3-30b-a3b --json-out out/mismatch_moe.json
    python benchmarks/bench_mismatch.py --shape qwen3-8b --weight-quantization fp8
    python benchmarks/bench_mismatch.py --shape qwen3-8b --weight-quantization fp8 \
        --activation-quantization fp8 --fp8-lm-head    # W8A8 projections, FP8 LM head
    python benchmarks/bench_mismatch.py --smoke            # tiny MoE on CPU, seconds
    python benchmarks/bench_mismatch.py --model smollm2 --length 1024 --weight-quantization fp8 \
        --kv-cache-dtype fp8    # a trained checkpoint (the built-in SmolLM2-135M-Instruct)

The engine samples --samples completions of exactly --length tokens (temperature 1, EOS
ignored) after random --prompt-len-token prompts, as a rollout does (CUDA graphs, compiled
layers, our kernels, bf16 on a GPU). A second model of the same classes, holding the very same
weight tensors, is the trainer: transformers' own forward (its default attention) over prompt +
completion scores each sampled token. Per bucket of completion positions: mean and max
|logp_rollout - logp_trainer|, KL(rollout || trainer) estimated from the sampled tokens (k1, the
mean log ratio the job logs as off_policy/kl, and k3, its always-positive estimator). For an MoE
shape the trainer runs twice, with its own routing and with the rollout's routes replayed
(trainer.routing_replay), and the share of (token, layer) routes its own top-k chose
differently is reported by position too.

With --weight-quantization fp8 the engine serves the FP8-rounded model and the trainer holds the
bf16 weights, as in training: `own_routing` (and `replayed_routes`) then measure the drift of
FP8 rollouts against the bf16 policy, and `fp8_model_trainer` scores with the rounded weights,
which isolates the kernels' share (the engine's weights are set back to bf16 after the rollout).
With --activation-quantization fp8 or fp8-group (and --fp8-lm-head) the engine's projections
round their inputs too (and its LM head is FP8; with --fp8-lm-head-input its input is rounded
as well): `fp8_model_trainer` then still rounds only the weights, so it holds the activations'
share as well.

With --kv-cache-dtype fp8 the engine's KV cache is FP8 as well (the trainer has no cache).

Random weights (--shape): the figures show the numerics of two implementations of one model, not
those of a trained checkpoint (whose sharper distributions, router margins and massive
activations differ). --model loads a trained one instead (a local transformers folder, or
"smollm2": the SmolLM2-135M-Instruct the project ships, runnable on CPU), prompted with a chat
question (--question) rather than random tokens. On CPU the engine and the trainer run fp32, so
the figures hold FP8's share alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()

EDGES = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def buckets(length: int) -> list[tuple[int, int]]:
    edges = [e for e in EDGES if e < length] + [length]
    return list(zip(edges[:-1], edges[1:], strict=True))


def trainer_model(engine_model):
    """transformers' model of the same config holding the engine model's own tensors (no copy):
    outside the engine's steps nothing of the engine touches it."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(engine_model.config)
    model.load_state_dict(engine_model.state_dict(), assign=True, strict=True)
    for name, buffer in engine_model.named_buffers():  # non-persistent ones (rotary) too
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._buffers[attr] = buffer
    return model.eval()


def sampled_logprobs(model, ids, extra: dict, chunk: int = 1024):
    """log p(ids[t + 1] | ids[: t + 1]) for every t, from one forward (the head in chunks)."""
    import torch

    with torch.no_grad():
        hidden = model.model(input_ids=ids[None], **extra).last_hidden_state[0]
        out = []
        for start in range(0, len(ids) - 1, chunk):
            end = min(start + chunk, len(ids) - 1)
            logits = model.lm_head(hidden[start:end]).float()
            out.append(logits.log_softmax(-1).gather(1, ids[start + 1 : end + 1, None])[:, 0])
    return torch.cat(out)


def figures(diff, k3, flipped, length: int) -> list[dict]:
    """Per position bucket: |dlogp| mean and max, KL k1 and k3, flipped routes (MoE)."""
    import numpy as np

    rows = []
    for lo, hi in buckets(length):
        d = np.concatenate([x[lo:hi] for x in diff])
        row = {
            "positions": [lo, hi],
            "tokens": int(d.size),
            "abs_dlogp_mean": float(np.abs(d).mean()),
            "abs_dlogp_max": float(np.abs(d).max()),
            "kl_k1": float(d.mean()),
            "kl_k3": float(np.concatenate([x[lo:hi] for x in k3]).mean()),
        }
        if flipped is not None:
            row["flipped_fraction"] = float(np.concatenate([x[lo:hi] for x in flipped]).mean())
        rows.append(row)
    return rows


def measure(args) -> dict:
    import torch

    from benchmarks.lib.workloads import SHAPES, build_model
    from rollout import EngineConfig, LLMEngine, SamplingParams
    from trainers.trl_adapter.routing_replay import RouteReplay

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"
    if args.model:
        model, prompt = trained_model(args.model, args.question, dtype, device)
        args.prompt_len = len(prompt)
        moe = any(getattr(model.config, k, 0) for k in ("num_experts", "num_local_experts"))
    else:
        shape = SHAPES[args.shape]
        moe = shape["arch"].endswith("_moe")
        model = build_model(shape, dtype, device)
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, model.config.vocab_size, (args.prompt_len,), generator=g)
        prompt = prompt.tolist()
    total = args.prompt_len + args.length + 16
    fp8 = args.weight_quantization == "fp8"
    # The bf16 weights the FP8 engine rounds in place, kept on the host for the trainer.
    originals = (
        {
            n: p.detach().to("cpu", copy=True)
            for n, p in model.named_parameters()
            if ".layers." in n or n == "lm_head.weight"
        }
        if fp8
        else None
    )
    engine = LLMEngine.from_model(
        model,
        EngineConfig(
            device=device,
            dtype=dtype,
            max_model_len=total,
            max_num_seqs=max(args.samples, 1),
            num_kv_blocks=args.samples * (-(-total // 16) + 1),
            enable_prefix_caching=False,
            record_routes=moe,
            weight_quantization=args.weight_quantization,
            activation_quantization=args.activation_quantization,
            fp8_lm_head=args.fp8_lm_head,
            fp8_lm_head_input=args.fp8_lm_head_input,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
    )
    params = SamplingParams(
        max_tokens=args.length, temperature=1.0, ignore_eos=True, seed=1, n=args.samples
    )
    started = time.perf_counter()
    results = engine.generate([prompt], params)
    rollout_s = time.perf_counter() - started
    print(f"[mismatch] rollout of {args.samples} x {args.length} tokens: {rollout_s:.1f} s")
    trainer = trainer_model(engine.model)
    replay = RouteReplay(trainer) if moe else None
    runs = {}
    if originals is not None:  # the rounded weights first, then the bf16 ones back in place
        runs["fp8_model_trainer"] = score(results, trainer, args, device, moe, replayed=False)
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                if name in originals:
                    param.copy_(originals[name])
        del originals
    runs["own_routing"] = score(results, trainer, args, device, moe, replayed=False)
    if moe:
        runs["replayed_routes"] = score(results, trainer, args, device, moe, replayed=True)
    if replay is not None:
        replay.take_counts()
    report = {
        "shape": args.model or args.shape,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": dtype,
        "samples": args.samples,
        "prompt_len": args.prompt_len,
        "length": args.length,
        "rollout_s": rollout_s,
        "route_bytes_per_token": int(results[0].routes[0].nbytes) if moe else 0,
        "weight_quantization": args.weight_quantization,
        "activation_quantization": args.activation_quantization,
        "fp8_lm_head": args.fp8_lm_head,
        "fp8_lm_head_input": args.fp8_lm_head_input,
        "kv_cache_dtype": args.kv_cache_dtype,
        "runs": {
            name: figures(diffs, k3s, flips, args.length)
            for name, (diffs, k3s, flips) in runs.items()
        },
    }
    return report


def trained_model(name: str, question: str, dtype: str, device: str):
    """(a trained checkpoint's model on `device` in `dtype`, the token ids of `question` as a
    chat prompt): `name` is a local transformers folder or "smollm2" (the built-in model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout.builtin_models import SMOLLM2, smollm2_path
    from rollout.prompts import PromptFormatter

    path = smollm2_path() if name in ("smollm2", SMOLLM2) else Path(name)
    if not (path / "config.json").exists():
        raise SystemExit(f"--model {name!r}: no transformers folder (config.json) at {path}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = PromptFormatter(tokenizer).prompt_ids([{"role": "user", "content": question}])
    return model.eval(), prompt


def score(results, trainer, args, device, moe: bool, replayed: bool):
    """(log-ratio per sample, k3 per sample, flipped-route share per sample or None): the
    trainer's logprobs of each sampled token against the rollout's, with the rollout's routes
    replayed or the trainer's own routing."""
    import numpy as np
    import torch

    from trainers.trl_adapter.routing_replay import own_routes, replay_kwargs

    diffs, k3s, flips = [], [], [] if moe and not replayed else None
    for r in results:
        ids = torch.tensor(r.prompt_token_ids + r.token_ids, device=device)
        rollout = np.asarray(r.logprobs, dtype=np.float64)
        extra = replay_kwargs(r.routes, len(ids), device) if replayed else {}
        trainer_lp = sampled_logprobs(trainer, ids, extra)[args.prompt_len - 1 :]
        d = rollout - trainer_lp.double().cpu().numpy()  # log(p_rollout / p_trainer)
        diffs.append(d)
        k3s.append(np.expm1(-d) + d)
        if flips is not None:
            own = own_routes(trainer, ids)
            recorded = r.routes[args.prompt_len - 1 : len(ids) - 1]  # inputs of the samples
            mine = own[args.prompt_len - 1 : len(ids) - 1]
            same = (np.sort(recorded, -1) == np.sort(mine, -1)).all(-1)  # [tokens, routers]
            flips.append(1.0 - same.mean(-1))
    return diffs, k3s, flips


def print_report(report: dict) -> None:
    print(
        f"[mismatch] {report['shape']} {report['dtype']} on {report['device']}: "
        f"{report['samples']} x ({report['prompt_len']} + {report['length']}) tokens, "
        f"weights {report['weight_quantization']}, "
        f"activations {report.get('activation_quantization', 'none')}, "
        f"FP8 LM head {report.get('fp8_lm_head', False)}"
        f"{' (its input rounded)' if report.get('fp8_lm_head_input') else ''}, "
        f"KV cache {report.get('kv_cache_dtype', 'auto')}, "
        f"rollout {report['rollout_s']:.1f} s"
    )
    if report["route_bytes_per_token"]:
        per = report["route_bytes_per_token"]
        print(f"[mismatch] routes: {per} B per token, {per * 16384 / 2**20:.1f} MiB per 16K sample")
    for name, rows in report["runs"].items():
        print(f"| {name} | positions | mean abs dlogp | max abs dlogp | KL k1 | KL k3 | flipped |")
        for row in rows:
            flipped = row.get("flipped_fraction")
            print(
                f"| | {row['positions'][0]}-{row['positions'][1]} | {row['abs_dlogp_mean']:.4f} "
                f"| {row['abs_dlogp_max']:.3f} | {row['kl_k1']:.2e} | {row['kl_k3']:.2e} | "
                + (f"{flipped:.4f} |" if flipped is not None else "- |")
            )


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.lib.report import commit_id
    from benchmarks.lib.workloads import SHAPES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--samples", type=int, default=4, help="one group of this many samples")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--length", type=int, default=16384, help="completion tokens, exactly")
    parser.add_argument("--smoke", action="store_true", help="tiny MoE shape on CPU, fp32")
    parser.add_argument(
        "--weight-quantization",
        default="none",
        choices=("none", "fp8"),
        help="the engine's weights (the trainer's stay bf16): fp8 measures FP8 rollouts' drift",
    )
    parser.add_argument(
        "--activation-quantization",
        default="none",
        choices=("none", "fp8", "fp8-group"),
        help="with --weight-quantization fp8: the projections' inputs rounded to e4m3 too, with "
        "a scale a row (fp8) or a scale per 128 inputs of a row (fp8-group)",
    )
    parser.add_argument(
        "--fp8-lm-head", action="store_true", help="with --weight-quantization fp8: the LM head too"
    )
    parser.add_argument(
        "--fp8-lm-head-input",
        action="store_true",
        help="with --fp8-lm-head and --activation-quantization: the head's input rounded too",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=("auto", "fp8"),
        help="the engine's KV cache: the model's dtype (auto) or FP8 with a scale a token and head",
    )
    parser.add_argument(
        "--model",
        default="",
        help="a trained checkpoint instead of --shape's random weights: a local transformers "
        "folder, or 'smollm2' (the built-in SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--question",
        default="Explain step by step how a binary search finds a number in a sorted list, then "
        "write it in Python and test it on three examples.",
        help="with --model: the user message the samples answer",
    )
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.samples, args.prompt_len, args.length = "tiny-moe", 2, 8, 40
    report = measure(args)
    report["commit"] = commit_id()
    report["date"] = time.strftime("%Y-%m-%d")
    print_report(report)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
