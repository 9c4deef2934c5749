"""One MoE layer's experts alone: transformers' grouped_mm path against our fused Triton kernel
(over bf16 weights, and over their FP8 copies);
and the two small launches in front of them, the router's softmax top-k and the pairs' sort,
each both ways.

    python benchmarks/bench_moe.py                        # Qwen3-30B-A3B's experts, 1..512 tokens
    python benchmarks/bench_moe.py --tokens 32 --sweep    # also try the kernel's tile choices
    python benchmarks/bench_moe.py --tokens 8192 --sweep  # ... at a prefill chunk's size
    python benchmarks/bench_moe.py --tokens 1,2,4 --sweep # ... at a handful of sequences

A decode step's experts read the weights of the experts its tokens picked, so the floor is those
bytes over the copy bandwidth. The routing is drawn uniformly at random per token (random-weight
routers are close to that); the touched experts are counted from it. Each timing replays a CUDA
graph (benchmarks/bench_gemm.py's `time_in_graph`) over two copies of the layer's weights (each
larger than L2), so the figure is what one layer costs inside a captured step.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemm import time_in_graph, widening_by_cast  # noqa: E402
from benchmarks.lib.roofline import floor_bandwidth  # noqa: E402

# Tile choices tried by --sweep: (BLOCK_M minimum, BLOCK_N, BLOCK_K, stages, warps). Decode
# sizes read the weights (narrow tiles, more programs); below TAIL_TOKENS a step touches only a
# few experts, whose column blocks alone would not fill the GPU, so narrower blocks and longer
# K steps are the candidates; from PREFILL_TOKENS on the experts are compute-bound, where larger
# tiles and more warps are.
DECODE_SWEEP = list(itertools.product((16, 32, 64), (32, 64, 128), (64, 128), (2, 3, 4), (4,)))
TAIL_SWEEP = list(itertools.product((16,), (16, 32, 64), (64, 128, 256), (3, 4, 6), (4,)))
PREFILL_SWEEP = list(itertools.product((64, 128), (64, 128), (64,), (3, 4), (4, 8)))
TAIL_TOKENS = 8
PREFILL_TOKENS = 512


def measure(tokens: int, args, sweep: bool) -> dict:
    import torch
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from rollout.kernels import (
        gpu_features,
        torch_moe,
        triton_expert_sort,
        triton_moe,
        triton_routing,
    )
    from rollout.kernels.torch_fp8 import quantize_rows

    config = Qwen3MoeConfig(
        hidden_size=args.hidden,
        moe_intermediate_size=args.intermediate,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
    )
    config._experts_implementation = "grouped_mm"
    g = torch.Generator(device="cuda").manual_seed(tokens)
    layers = []
    for _ in range(2):
        with torch.device("cuda"):
            experts = Qwen3MoeExperts(config).to(torch.bfloat16)
        with torch.no_grad():
            experts.gate_up_proj.normal_(std=0.02, generator=g)
            experts.down_proj.normal_(std=0.02, generator=g)
        layers.append(experts)
    x = torch.randn(tokens, args.hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    scores = torch.rand(tokens, args.experts, device="cuda", generator=g)
    weights, index = torch.softmax(scores, -1).topk(args.top_k, dim=-1)
    touched = int(torch.unique(index).numel())
    expert_bytes = 3 * args.hidden * args.intermediate * 2
    floor_ms = 1e3 * touched * expert_bytes / floor_bandwidth("cuda")[0]

    def fused(i):
        return triton_moe.fused_experts(
            x, index, weights, layers[i].gate_up_proj, layers[i].down_proj
        )

    # FP8 copies of both layers (e4m3, a scale per output row), as weight_quantization="fp8"
    fp8 = [(quantize_rows(m.gate_up_proj), quantize_rows(m.down_proj)) for m in layers]

    def fused_fp8(i):
        (gate_up, gate_up_scale), (down, down_scale) = fp8[i]
        return triton_moe.fused_experts(x, index, weights, gate_up, down, gate_up_scale, down_scale)

    with torch.no_grad():
        want = layers[0](x, index, weights)
        got = fused(0)
        error = (got.float() - want.float()).abs().max().item()
        grouped_ms = time_in_graph(lambda i: layers[i](x, index, weights), copies=2)
        fused_ms = time_in_graph(fused, copies=2)
        fused_fp8_ms = time_in_graph(fused_fp8, copies=2)
        fp8_out = fused_fp8(0).clone()
        with widening_by_cast():  # e4m3 widened by Triton's own cast instead
            fused_fp8_cast_ms = time_in_graph(fused_fp8, copies=2)
            fp8_widenings_agree = bool(torch.equal(fp8_out, fused_fp8(0)))
        # The pairs' expert order in front of the fused launches, both ways.
        sort_ms = {
            "torch_sort": time_in_graph(
                lambda i: torch_moe.sort_by_expert(index, args.experts), copies=2
            ),
            "counting_sort": time_in_graph(
                lambda i: triton_expert_sort.sort_pairs_by_expert(index, args.experts), copies=2
            ),
        }
        # The router's softmax top-k in front of them: its PyTorch code, and our one launch.
        router_logits = torch.randn(
            tokens, args.experts, device="cuda", dtype=torch.bfloat16, generator=g
        )
        routing_ms = {
            "torch": time_in_graph(
                lambda i: torch_moe.top_k_routing_reference(
                    router_logits, args.top_k, True, torch.bfloat16
                ),
                copies=2,
            ),
            "fused": time_in_graph(
                lambda i: triton_routing.top_k_routing(
                    router_logits, args.top_k, True, torch.bfloat16
                ),
                copies=2,
            ),
        }
    row = {
        "tokens": tokens,
        "touched_experts": touched,
        "floor_ms": floor_ms,
        "grouped_mm_ms": grouped_ms,
        "fused_ms": fused_ms,
        "fused_floor_fraction": floor_ms / fused_ms,
        "fused_fp8_ms": fused_fp8_ms,
        "fused_fp8_floor_fraction": floor_ms / 2 / fused_fp8_ms,
        "fused_fp8_cast_ms": fused_fp8_cast_ms,
        "fp8_widenings_agree": fp8_widenings_agree,
        "grouped_mm_floor_fraction": floor_ms / grouped_ms,
        "max_abs_diff": error,
        "sort_ms": sort_ms,
        "routing_ms": routing_ms,
        "counting_sort_used": tokens * args.top_k <= triton_expert_sort.COUNTING_SORT_MAX_PAIRS,
        "tiles": triton_moe.tiles(
            tokens * args.top_k,
            args.experts,
            torch.bfloat16,
            args.intermediate,
            gpu_features.sm_count(x.device),
        ),
    }
    if sweep:
        default_tiles = triton_moe.tiles
        best = None
        tried = []
        if tokens >= PREFILL_TOKENS:
            choices = PREFILL_SWEEP
        else:
            choices = TAIL_SWEEP if tokens < TAIL_TOKENS else DECODE_SWEEP
        for block_m, block_n, block_k, stages, warps in choices:

            def tiles(num_pairs, num_experts, dtype, inter=0, sm_count=0, m=block_m, n=block_n,
                      k=block_k, s=stages, w=warps):  # fmt: skip
                chosen = default_tiles(num_pairs, num_experts, dtype)
                chosen.update(BLOCK_M=max(m, chosen["BLOCK_M"]), BLOCK_N=n, BLOCK_K=k)
                chosen.update(num_stages=s, num_warps=w)
                return chosen

            triton_moe.tiles = tiles
            try:
                with torch.no_grad():
                    ms = time_in_graph(fused, copies=2)
            except Exception as err:  # noqa: BLE001 - a tile that does not fit is skipped
                print(f"[moe]   tiles {block_m, block_n, block_k, stages}: {err}", flush=True)
                continue
            finally:
                triton_moe.tiles = default_tiles
            choice = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, stages=stages,
                          warps=warps)  # fmt: skip
            tried.append({**choice, "ms": ms})
            if best is None or ms < best[0]:
                best = (ms, choice)
        row["sweep_best_ms"], row["sweep_best_tiles"] = best
        row["sweep"] = sorted(tried, key=lambda t: t["ms"])
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", default="1,8,32,128,512,2048,8192")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.lib.report import commit_id

    if not torch.cuda.is_available():
        raise SystemExit("bench_moe.py needs a CUDA device")
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        rows.append(measure(tokens, args, args.sweep))
        r = rows[-1]
        print(
            f"[moe] {tokens:5d} tokens, {r['touched_experts']:3d} experts: floor "
            f"{r['floor_ms']:.3f} ms | grouped_mm {r['grouped_mm_ms']:.3f} ms "
            f"({r['grouped_mm_floor_fraction']:.0%}) | fused {r['fused_ms']:.3f} ms "
            f"({r['fused_floor_fraction']:.0%}) | FP8 {r['fused_fp8_ms']:.3f} ms "
            f"({r['fused_fp8_floor_fraction']:.0%} of its floor; by cast {r['fused_fp8_cast_ms']:.3f} ms"
            f"{'' if r['fp8_widenings_agree'] else ', OUTPUTS DIFFER'}) | max |diff| {r['max_abs_diff']:.2g} | sort: "
            f"torch {1e3 * r['sort_ms']['torch_sort']:.1f} us, counting "
            f"{1e3 * r['sort_ms']['counting_sort']:.1f} us | routing: torch "
            f"{1e3 * r['routing_ms']['torch']:.1f} us, fused {1e3 * r['routing_ms']['fused']:.1f} us"
            + (f" | sweep best {r['sweep_best_ms']:.3f} ms {r['sweep_best_tiles']}" if args.sweep else ""),
            flush=True,
        )  # fmt: skip
    if args.json_out:
        report = {
            "device": torch.cuda.get_device_name(),
            "date": datetime.date.today().isoformat(),
            "commit": commit_id(),
            "command": " ".join(sys.argv),
            "shape": vars(args),
            "rows": rows,
        }
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
