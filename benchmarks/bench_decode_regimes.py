"""Where a decode step's time goes in each regime of a grpo run: a few sequences with short
contexts (bound by the weight read) up to many with long ones (bound by the KV read).

    python benchmarks/bench_decode_regimes.py --shape qwen3-8b --json-out out/regimes.json
    python benchmarks/bench_decode_regimes.py --smoke          # tiny model on CPU, no profile

For each point "BxC" (B sequences decoding at a context of about C tokens; random weights,
EOS ignored, the overlap loop with CUDA graphs as in the rollout benchmark), it reports:
  - the wall time per decode step (the mean over --steps steps),
  - the step's bandwidth floor: the weights (touched experts only for MoE) plus the B contexts'
    KV over the copy bandwidth, and the fraction of it reached,
  - on a GPU, the device time per step by kind of kernel (GEMMs, attention, KV writes, MoE
    experts, sampler, fused norms and elementwise, copies, other) from a profile of --steps
    more steps, and the gap: wall time that no kernel covers (launch gaps inside the graph, the
    host).
With --verify-drafts K, each point also times verification steps of K drafts a sequence against
the plain step (what speculative decoding's verification costs where it runs).
A point whose batch does not stay whole through those steps (its KV does not fit the cache,
so sequences are preempted and recomputed) stops the run with a message.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Kernel kinds by name, first match wins (cuBLAS / CUTLASS GEMMs, our Triton kernels, inductor's
# fused kernels named triton_poi_ / triton_red_ / triton_per_).
KERNEL_KINDS = (
    ("moe experts", r"_gate_up_kernel|_down_kernel|grouped_mm|_moe"),
    # Our routers' softmax top-k, and the sort of a step's token-expert pairs in front of the
    # experts (ours, or torch.sort's); torch.topk's launches count under "sampler".
    ("moe routing", r"_top_k_routing|_counting_sort|radixSort|bitonicSort|segmented_sort"),
    ("gemm", r"nvjet|gemm|cutlass|splitK|_decode_linear|xmma|cublas|sm90"),
    ("attention", r"_decode_kernel|_extend_kernel|attention|flash|fmha"),
    ("kv write", r"_write_kv"),
    ("sampler", r"_sample_|argmax|softmax|topk|sort"),
    ("fused norms and elementwise", r"^triton_"),
    ("copies", r"[Mm]emcpy|[Mm]emset|copy|fill|index"),
)


def kernel_kind(name: str) -> str:
    for kind, pattern in KERNEL_KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def parse_points(text: str) -> list[tuple[int, int]]:
    points = []
    for item in text.split(","):
        try:
            batch, context = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--points: {item!r} is not BxC (e.g. 8x2048)") from None
        if batch < 1 or context < 2:
            raise SystemExit(f"--points: {item!r} needs B >= 1 and C >= 2")
        points.append((batch, context))
    return points


def measure_point(
    engine, model, batch: int, context: int, steps: int, profile: bool, verify_drafts: int = 0
) -> dict:
    """Decode `batch` sequences from a `context`-token prompt (distinct random prompts) for
    `steps` timed steps, then `steps` profiled ones, then (verify_drafts > 0) `steps`
    verification steps of that many drafts a sequence."""
    import torch

    from benchmarks.lib.roofline import (
        engine_kv_bytes_per_token,
        engine_step_floor,
        floor_bandwidth,
    )
    from rollout import SamplingParams

    cuda = engine.device.type == "cuda"
    g = torch.Generator().manual_seed(batch * 100_003 + context)
    vocab = min(16000, model.config.vocab_size)
    # Every sequence must still be decoding in the last profiled step (see decode_tokens).
    params = SamplingParams(
        max_tokens=decode_tokens(batch, context, steps, engine.config.max_num_batched_tokens),
        ignore_eos=True,
    )
    ids = [f"b{batch}c{context}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        prompt = torch.randint(0, vocab, (context,), generator=g).tolist()
        engine.add_request(prompt, params, request_id=request_id, first_index=i)
    # Admit every prompt first (prefill chunks), then decode until the batch is steady.
    scheduler = engine.debug_internals().scheduler  # whether every prompt is computed
    while scheduler.waiting or any(
        s.num_computed_tokens < s.num_prompt_tokens for s in scheduler.running
    ):
        engine.step()
    for _ in range(WARM_STEPS):  # the decode graph of this batch size captured
        engine.step()
    preemptions = engine.stats().preemptions
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()  # the overlap loop: one step stays in flight, as in a rollout
    if cuda:
        torch.cuda.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - start) / steps
    result = {"batch": batch, "context": context, "ms_per_step": wall_ms}

    kv_per_token = engine_kv_bytes_per_token(engine)
    # The measured steps' mean context, to within the prefill's stagger.
    mean_context = context + WARM_STEPS + steps // 2
    floor, _ = engine_step_floor(model, engine, mean_context, [1] * batch)
    result["floor_ms"] = 1e3 * float(floor[0]) if cuda else None
    result["of_floor"] = result["floor_ms"] / result["ms_per_step"] if cuda else None
    result["kv_share_of_floor"] = (
        batch * mean_context * kv_per_token / (float(floor[0]) * floor_bandwidth(engine.device)[0])
        if cuda
        else None
    )

    if profile and cuda:
        result |= profile_steps(engine, steps, wall_ms)
    if verify_drafts:
        result |= time_verifications(engine, steps, verify_drafts, wall_ms, cuda, profile)
    # The whole batch decoded through every measured step, none preempted (a point whose KV
    # does not fit the cache measures recomputation instead: it is refused).
    stats = engine.stats()
    if stats.running_sequences != batch or stats.preemptions != preemptions:
        raise SystemExit(
            f"point {batch}x{context}: the batch did not stay whole ({stats.running_sequences}"
            f" running, {stats.preemptions - preemptions} preemptions): its KV "
            "does not fit the cache; use a smaller point"
        )
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    return result


WARM_STEPS = 12


def profile_steps(engine, steps: int, wall_ms: float, prefix: str = "") -> dict:
    """Device time per step by kind of kernel over `steps` more steps, and the gap to the wall
    time `wall_ms` (keys prefixed with `prefix`)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    kinds: dict[str, float] = {}
    top = []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if not us:
            continue
        kind = kernel_kind(event.key)
        kinds[kind] = kinds.get(kind, 0.0) + us / steps / 1e3
        top.append((us / steps / 1e3, event.count / steps, kind, event.key[:80]))
    kernels_ms = sum(kinds.values())
    top.sort(reverse=True)
    return {
        f"{prefix}kernels_ms": kernels_ms,
        f"{prefix}gap_ms": wall_ms - kernels_ms,
        f"{prefix}by_kind_ms": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        f"{prefix}top_kernels": [
            {"ms": ms, "calls": calls, "kind": kind, "name": name}
            for ms, calls, kind, name in top[:24]
        ],
    }


def time_verifications(
    engine, steps: int, drafts: int, plain_ms: float, cuda: bool, profile: bool = False
) -> dict:
    """Wall time of speculative verification steps at the current batch: every sequence
    verifies `drafts` drafts a step (its last token repeated: with random weights they are
    rejected, so this is the cost of a verification, not its gain), scheduled and run as the
    engine runs real ones (block tables, CUDA graphs, the sync order of the overlap loop).
    With `profile`, also their device time by kind of kernel over `steps` more of them (the gap
    to the wall time is the host's share: a verification step is not overlapped)."""
    import torch

    scheduler = engine.debug_internals().scheduler

    def forced_draft(seq, budget: int) -> list[int]:
        most = min(drafts, seq.token_limit - len(seq.token_ids) - 1, budget - 1)
        return [seq.token_ids[-1]] * max(most, 0)

    speculation = scheduler.speculation
    speculation.draft = forced_draft  # in place of the n-gram drafts
    speculation.max_drafts, speculation.max_pause = drafts, 0
    try:
        for _ in range(4):  # the verification graphs of this batch size captured
            engine.step()
        stats = speculation.stats
        before = (stats.verifications, stats.emitted)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        if cuda:
            torch.cuda.synchronize()
        verify_ms = 1e3 * (time.perf_counter() - start) / steps
        profiled = profile_steps(engine, steps, verify_ms, "verify_") if profile and cuda else {}
    finally:
        del speculation.draft
        speculation.max_drafts = 0
    verifications = stats.verifications - before[0]
    return profiled | {
        "verify_drafts": drafts,
        "verify_ms_per_step": verify_ms,
        "verify_over_plain": verify_ms / plain_ms,
        "verifications_per_step": verifications / steps,
        "tokens_per_verification": (stats.emitted - before[1]) / verifications
        if verifications
        else 0.0,
    }


def decode_tokens(batch: int, context: int, steps: int, per_step: int) -> int:
    """New tokens per sequence that cover the prefill's stagger (a sequence admitted first
    decodes while the later prompts are prefilled, `per_step` prompt tokens a step), the
    warm-up, the timed and the profiled steps, plain and verifying."""
    stagger = -(-batch * context // per_step) + batch
    return stagger + WARM_STEPS + 4 * steps + 12


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="qwen3-8b", help="a key of workloads.SHAPES")
    parser.add_argument(
        "--points",
        default="1x1024,2x1024,4x2048,8x2048,16x4096,64x4096,128x4096",
        help="BxC: B sequences decoding at a context of C tokens, comma-separated",
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, no profile")
    parser.add_argument(
        "--verify-drafts",
        type=int,
        default=0,
        help="also time speculative verification steps of this many drafts a sequence",
    )
    parser.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--decode-tiles",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="GPU: change a field of the decode attention's launch shape (DecodeTiles), e.g. "
        "target_programs=0 for fixed 512-token pieces",
    )
    parser.add_argument(
        "--e4m3-bits",
        action="store_true",
        help="GPU, FP8 activations: round with the bit arithmetic, not the GPU's conversion "
        "instruction (triton_rounded_rows.HW_E4M3), to time the two",
    )
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.bench_rollout import _engine_overrides
    from benchmarks.lib.decode_tiles import set_decode_tiles
    from benchmarks.lib.report import commit_id
    from benchmarks.lib.workloads import SHAPES, build_model
    from rollout import EngineConfig, LLMEngine

    if args.smoke:
        args.shape, args.points, args.steps, args.no_profile = "tiny", "1x16,4x32", 4, True
    if args.shape not in SHAPES:
        raise SystemExit(f"--shape {args.shape!r}: one of {', '.join(SHAPES)}")
    points = parse_points(args.points)
    device = "cuda" if not args.smoke else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device; try --smoke on CPU")
    if args.e4m3_bits:
        from rollout.kernels import triton_rounded_rows

        triton_rounded_rows.HW_E4M3 = False
    from benchmarks.lib.roofline import floor_bandwidth

    floor_bandwidth(device)  # measured (off an H200) before the model takes the memory
    torch.manual_seed(0)
    dtype = "bfloat16" if device == "cuda" else "float32"
    model = build_model(SHAPES[args.shape], dtype, device)
    per_step = 8192  # prompt tokens a step
    longest = max(c + decode_tokens(b, c, args.steps, per_step) for b, c in points)
    settings = dict(
        device=device,
        dtype=dtype,
        max_model_len=longest,
        max_num_seqs=max(b for b, _ in points),
        max_num_batched_tokens=per_step,
        overlap=True,
        cuda_graphs=device == "cuda",
        compile_model=device == "cuda",
    )
    if args.verify_drafts:
        settings.update(
            speculative="ngram",
            num_speculative_tokens=args.verify_drafts,
            speculative_max_seqs=settings["max_num_seqs"],
        )
    settings.update(_engine_overrides(args.engine))
    decode_tiles = set_decode_tiles(args.decode_tiles) if device == "cuda" else None
    engine = LLMEngine.from_model(model, EngineConfig(**settings))
    # Plain decoding, but for the verification timings.
    engine.debug_internals().scheduler.speculation.max_drafts = 0
    commit, date = commit_id(), datetime.date.today().isoformat()
    report = {
        "benchmark": "decode_regimes",
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "commit": commit,
        "date": date,
        "engine": settings,
        "decode_tiles": decode_tiles,
        "steps": args.steps,
        "points": [],
    }
    for batch, context in points:
        print(f"[regimes] {batch} x {context} ...", flush=True)
        point = measure_point(
            engine, model, batch, context, args.steps, not args.no_profile, args.verify_drafts
        )
        report["points"].append(point)
        _print_point(point)
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps(report, indent=1))
    _print_table(report)


def _print_point(p: dict) -> None:
    floor = "" if p["floor_ms"] is None else f", floor {p['floor_ms']:.2f} ms ({p['of_floor']:.0%})"
    print(f"[regimes]   {p['ms_per_step']:.2f} ms/step{floor}", flush=True)
    if "verify_ms_per_step" in p:
        print(
            f"[regimes]   verification of {p['verify_drafts']} drafts: "
            f"{p['verify_ms_per_step']:.2f} ms/step ({p['verify_over_plain']:.2f}x plain), "
            f"{p['tokens_per_verification']:.2f} tokens each",
            flush=True,
        )
    for prefix, what in (("", "kernels"), ("verify_", "verification kernels")):
        if f"{prefix}by_kind_ms" in p:
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in p[f"{prefix}by_kind_ms"].items())
            print(
                f"[regimes]   {what} {p[f'{prefix}kernels_ms']:.2f} ms ({kinds}); "
                f"gap {p[f'{prefix}gap_ms']:.2f} ms"
            )


def _print_table(report: dict) -> None:
    print(f"\n{report['shape']} on {report['device']} ({report['commit']}, {report['date']})")
    kinds = sorted({k for p in report["points"] for k in p.get("by_kind_ms", {})})
    header = ["B x C", "ms/step", "floor ms", "of floor", *kinds, "gap ms"]
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for p in report["points"]:
        cells = [
            f"{p['batch']} x {p['context']}",
            f"{p['ms_per_step']:.2f}",
            "-" if p["floor_ms"] is None else f"{p['floor_ms']:.2f}",
            "-" if p["of_floor"] is None else f"{p['of_floor']:.0%}",
            *(f"{p['by_kind_ms'].get(k, 0):.2f}" for k in kinds),
            f"{p['gap_ms']:.2f}" if "gap_ms" in p else "-",
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
