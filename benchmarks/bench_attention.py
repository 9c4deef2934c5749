"""Decode attention kernel alone: effective bandwidth of the Triton split-KV kernel on the GPU.

    python benchmarks/bench_attention.py                   # 64 sequences x 4096 context, Llama-3-8B heads
    python benchmarks/bench_attention.py --seqs 32 --context 8192
    python benchmarks/bench_attention.py --seqs 32 --context 1300 --max-context 2320 --sweep
                                                        # w1's mean context; try the tile choices
    python benchmarks/bench_attention.py --regimes      # a grpo run's batches, launch choices
    python benchmarks/bench_attention.py --regimes --fp8-kv   # the same batches, FP8 KV cache

Effective bandwidth = bytes of K and V read (each once) / kernel time (median of do_bench), next
to torch SDPA on the same KV stored contiguously (no paging) and a plain device copy.

--regimes times the kernel at the batches a grpo run goes through (from one sequence at 1K
tokens to 128 at 2K, under a 16K static maximum), for each of a few launch choices
(`DecodeTiles.target_programs`, longest piece): each time is the replay of a CUDA graph of 36
launches (one per layer of an 8B model) over the number of launches, as the engine runs it
(bench_gemm's `time_in_graph`); do_bench's per-call timing would add the host's launch time to
kernels of a few microseconds. With --fp8-kv each point times the bf16 cache at the default
launch beside an FP8 cache (e4m3, a scale per token and KV head, K and the scales laid out head by
head and V by token: as the engine stores it) at the default and a few other launch choices, the
FP8 cache's bytes counted for its bandwidth; "bf16 tiles" widens the keys to the query's bf16
rather than to fp16 (`triton_attention_tiles.fp16_keys`); "scales by slot" reads the scales laid
out [block, slot, KV head], "K by slot" K laid out [block, slot, KV head, dim]; --v-by-dim adds V
laid out by dim, as a bf16 cache's. Pages are of --block-size tokens, for both caches of a run:
32 with --fp8-kv (the engine's FP8 default; a bf16 cache reads the same at 16 or 32), else 16.
--shared-prefix P makes each group of --group-size sequences read the same pages for their first
P tokens, as the samples of a grpo prompt do (the reads are counted as read, shared or not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument(
        "--block-size", type=int, default=0,
        help="tokens a page (default: 32 with --fp8-kv, as the engine's FP8 cache; else 16)",
    )  # fmt: skip
    parser.add_argument(
        "--max-context", type=int, default=0, help="the engine's static bound (default: --context)"
    )
    parser.add_argument("--sweep", action="store_true", help="also time other decode tile choices")
    parser.add_argument(
        "--regimes", action="store_true", help="time launch choices at a grpo run's batches"
    )
    parser.add_argument(
        "--points",
        default="1x1024,1x4096,1x16384,2x8192,4x2048,4x16384,8x2048,8x8192,16x4096,"
        "32x1300,64x4096,128x2048",
        help="with --regimes: BxC batches (B sequences, C context); BxC~ draws the B contexts "
        "from grpo's length distribution with median C (lognormal, sigma 1, 256 to 16,384)",
    )
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="with --regimes: the first this many tokens of each group of --group-size sequences "
        "are the same pages, as a grpo group's prompt is",
    )
    parser.add_argument("--group-size", type=int, default=8, help="with --shared-prefix")
    parser.add_argument(
        "--verify-width", type=int, default=5, help="with --regimes: tokens a verified sequence"
    )
    parser.add_argument(
        "--fp8-kv", action="store_true", help="with --regimes: an FP8 cache against bf16's"
    )
    parser.add_argument(
        "--v-by-dim",
        action="store_true",
        help="with --regimes --fp8-kv: also the FP8 cache with V laid out by dim, as bf16's (the "
        "engine lays an FP8 cache's V out by token)",
    )
    parser.add_argument(
        "--choices",
        default="",
        help="with --regimes: only these launch choices (names as printed, ';'-separated, each "
        "optionally followed by ' with FIELD=N,...' to change DecodeTiles fields), e.g. "
        "one choice's launches alone under a profiler",
    )
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()

    import torch
    import triton.testing

    from rollout.engine.config import default_block_size
    from rollout.kernels import triton_paged_attention as kernels

    args.block_size = args.block_size or default_block_size("fp8" if args.fp8_kv else "auto")
    if args.regimes:
        rows = sweep_regimes(args)
        if args.json_out:
            Path(args.json_out).write_text(
                json.dumps({"args": vars(args), "regimes": rows}, indent=1)
            )
        return

    torch.manual_seed(0)
    s, n, hkv, d, bs = args.seqs, args.context, args.kv_heads, args.head_dim, args.block_size
    pages = n // bs
    num_blocks = s * pages
    dtype = torch.bfloat16
    k_cache = torch.randn(num_blocks, bs, hkv, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    block_tables = torch.randperm(num_blocks, device="cuda").view(s, pages).int()
    seq_lens = torch.full((s,), n, device="cuda", dtype=torch.int32)
    query = torch.randn(s, args.heads, d, device="cuda", dtype=dtype)
    kv_bytes = 2 * s * n * hkv * d * k_cache.element_size()

    max_context = args.max_context or n

    def paged(tiles=kernels.DECODE_TILES):
        kernels.decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, d**-0.5, max_context, tiles
        )

    k_dense = torch.randn(s, hkv, n, d, device="cuda", dtype=dtype)
    v_dense = torch.randn_like(k_dense)
    q_dense = query.view(s, args.heads, 1, d)

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(q_dense, k_dense, v_dense, enable_gqa=True)

    src = torch.empty(kv_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)

    results = {}
    for name, fn, nbytes in (
        ("triton paged decode", paged, kv_bytes),
        ("torch SDPA, contiguous KV", sdpa, kv_bytes),
        ("device copy (read + write)", copy, 2 * src.numel()),
    ):
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        results[name] = {"ms": ms, "tb_per_s": nbytes / ms / 1e9}
    print(
        f"decode attention, {s} seqs x {n} context, {args.heads}/{hkv} heads x {d}, bf16, "
        f"{kv_bytes / 1e9:.2f} GB of KV"
    )
    for name, r in results.items():
        print(f"  {name:30s} {r['ms']:.3f} ms  {r['tb_per_s']:.2f} TB/s")
    if args.sweep:
        results["sweep"] = sweep_decode_tiles(paged, kv_bytes)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"args": vars(args), "results": results}, indent=1)
        )


def sweep_decode_tiles(paged, kv_bytes: int) -> list[dict]:
    """Median time of the decode kernel for each tile choice, best first (shared-memory misfits
    are skipped)."""
    import triton.testing

    from rollout.kernels.triton_decode_attention import DecodeTiles

    choices = [DecodeTiles(256, bn, 4, st) for bn in (32, 64, 128) for st in (2, 3, 4)]
    choices += [DecodeTiles(512, bn, 4, st) for bn in (64, 128) for st in (2, 3)]
    choices += [DecodeTiles(256, 64, w, 2) for w in (2, 8)]
    rows = []
    for tiles in choices:
        try:
            ms = triton.testing.do_bench(
                lambda t=tiles: paged(t), warmup=25, rep=150, return_mode="median"
            )
        except Exception as err:  # noqa: BLE001 - e.g. out of shared memory: not a candidate
            print(f"  {tiles}: skipped ({type(err).__name__})")
            continue
        rows.append({"tiles": vars(tiles), "ms": ms, "tb_per_s": kv_bytes / ms / 1e9})
    rows.sort(key=lambda r: r["ms"])
    print("decode tile sweep (best first):")
    for r in rows:
        print(f"  {r['tiles']}  {r['ms']:.3f} ms  {r['tb_per_s']:.2f} TB/s")
    return rows


def tiles_of(choice: str) -> str:
    """The FP8 KV tiles a choice's name asks for ("bf16 tiles", else the engine's fp16 K)."""
    return "bf16" if "bf16 tiles" in choice else "fp16 K"


def with_fields(tiles, choice: str):
    """`tiles` with the DecodeTiles fields a choice's name sets after " with ", e.g.
    "FP8 KV with num_stages=5,block_n=64"."""
    if " with " not in choice:
        return tiles
    fields = {}
    for item in choice.split(" with ", 1)[1].split(","):
        name, _, value = item.partition("=")
        if name.strip() not in vars(tiles) or not value.strip().lstrip("-").isdigit():
            raise SystemExit(f"--choices {choice!r}: {item!r} is not a DecodeTiles field=integer")
        fields[name.strip()] = int(value)
    return dataclasses.replace(tiles, **fields)


def share_prefix(block_tables, pages: int, group: int):
    """Block tables whose first `pages` entries are the same within each group of `group` rows
    (the group's first row's), as the samples of one grpo prompt share its pages."""
    import torch

    if pages <= 0 or group <= 1:
        return block_tables
    first = torch.arange(block_tables.shape[0], device=block_tables.device) // group * group
    shared = block_tables.clone()
    shared[:, :pages] = block_tables[first, :pages]
    return shared


def point_contexts(point: str) -> list[int]:
    """The contexts of a --points entry: "BxC", B sequences at C tokens; "BxC~", B contexts drawn
    (seeded) as the grpo workload draws its lengths, with median C (`GrpoWorkload.sample_lengths`:
    lognormal, sigma 1, 256 .. 16,384): a batch whose longest pieces, not its total read, may set
    a launch's time."""
    from benchmarks.lib.workloads import GrpoWorkload

    batch, _, context = point.partition("x")
    try:
        b, c = int(batch), int(context.rstrip("~"))
    except ValueError:
        raise SystemExit(f"--points {point!r}: BxC or BxC~, e.g. 64x4096 or 48x2048~") from None
    if b < 1 or c < 1:
        raise SystemExit(f"--points {point!r}: B and C must be positive")
    if not context.endswith("~"):
        return [c] * b
    draw = GrpoWorkload("mixed", "qwen3-8b", num_prompts=b, group_size=1, length_median=c)
    return draw.sample_lengths()


def sweep_regimes(args) -> list[dict]:
    """Per batch point and launch choice: microseconds per launch inside a CUDA graph."""
    import functools

    import torch
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    from benchmarks.bench_gemm import time_in_graph
    from rollout.kernels import triton_decode_attention as decode
    from rollout.kernels import triton_paged_attention as kernels
    from rollout.kernels.torch_fp8 import quantize_kv
    from rollout.kernels.torch_paged_attention import keys_by_head, scales_by_head, v_by_token
    from rollout.kernels.triton_attention_tiles import fp8_kv_tiles

    hkv, d, bs, dtype = args.kv_heads, args.head_dim, args.block_size, torch.bfloat16
    max_context = args.max_context or 16640
    base = decode.DECODE_TILES
    up_to_512 = dataclasses.replace(base, full_batch_split_len=0)
    if args.fp8_kv:
        up_to_1024 = dataclasses.replace(base, fp8_full_batch_split_len=1024)
        choices = {
            "bf16 KV": base,
            # the engine's FP8 read: K widened to fp16 (one conversion instruction per two
            # values), V laid out by token and widened to bf16 (integer instructions), the keys
            # on the MMA's wide side, pieces up to 2,048 at a full batch
            "FP8 KV": base,
            "FP8, up to 1024 at a full batch": up_to_1024,
            "FP8, bf16 tiles": base,
            "FP8, bf16 tiles, up to 1024 at a full batch": up_to_1024,
            "FP8, 2 stages": dataclasses.replace(base, num_stages=2),
            "FP8, 2 warps": dataclasses.replace(base, num_warps=2),
            "FP8, 8 warps": dataclasses.replace(base, num_warps=8),
            "FP8, merge loads of 64 pairs": dataclasses.replace(base, merge_pairs=64),
            # the query rows on the MMA's wide side (padded to 16), as a bf16 cache's tiles
            "FP8, query rows wide": dataclasses.replace(base, fp8_keys_wide=False),
            # the scales laid out by slot ([block, slot, KV head]), not head by head
            "FP8, scales by slot": base,
            # K laid out by slot ([block, slot, KV head, dim]: a page's keys of one KV head in
            # 128-byte pieces a slot apart), as a bf16 cache's, not head by head
            "FP8, K by slot": base,
        }
        if args.v_by_dim:
            choices["FP8, V by dim"] = base
    else:
        choices = {
            "fixed 512-token pieces": dataclasses.replace(up_to_512, target_programs=0),
            **{
                f"target {t} programs": dataclasses.replace(up_to_512, target_programs=t)
                for t in (128, 256, 512, 1024)
            },
            "target 256, pieces up to 1024": dataclasses.replace(
                up_to_512, target_programs=256, split_len=1024
            ),
            "target 256, up to 1024 at a full batch": dataclasses.replace(
                base, target_programs=256, full_batch_split_len=1024
            ),
        }
    if args.choices:
        wanted = [name.strip() for name in args.choices.split(";")]
        unknown = [name for name in wanted if name.split(" with ")[0] not in choices]
        if unknown:
            raise SystemExit(f"--choices: unknown {unknown}; one of {list(choices)}")
        choices = {name: with_fields(choices[name.split(" with ")[0]], name) for name in wanted}
    rows = []
    for point in args.points.split(","):
        contexts = point_contexts(point)
        s, n = len(contexts), max(contexts)
        pages = -(-n // bs)
        torch.manual_seed(0)
        k_cache = torch.randn(s * pages, bs, hkv, d, device="cuda", dtype=dtype)
        inputs = (
            torch.randn(s, args.heads, d, device="cuda", dtype=dtype),  # query
            k_cache,
            torch.randn_like(k_cache),  # v_cache
            share_prefix(
                torch.randperm(s * pages, device="cuda").view(s, pages).int(),
                args.shared_prefix // bs,
                args.group_size,
            ),  # block tables
            torch.tensor(contexts, device="cuda", dtype=torch.int32),  # seq_lens
            d**-0.5,
            max_context,
        )
        kv_bytes = 2 * sum(contexts) * hkv * d * k_cache.element_size()
        fp8_inputs = by_dim_inputs = k_by_slot_inputs = fp8_kv_bytes = None
        if args.fp8_kv:
            k8, k_scale_by_slot = quantize_kv(k_cache)
            v8, v_scale_by_slot = quantize_kv(inputs[2])
            k_scale, v_scale = scales_by_head(k_scale_by_slot), scales_by_head(v_scale_by_slot)
            fp8_inputs = (inputs[0], keys_by_head(k8), v_by_token(v8), *inputs[3:])
            by_dim_inputs = (inputs[0], fp8_inputs[1], v8, *inputs[3:])
            k_by_slot_inputs = (inputs[0], k8, *fp8_inputs[2:])
            fp8_kv_bytes = kv_bytes // 2 + 2 * sum(contexts) * hkv * k_scale.element_size()
        line = []
        for name, tiles in choices.items():
            fp8 = args.fp8_kv and name.startswith("FP8")
            chosen = inputs
            if fp8:
                chosen = by_dim_inputs if name.endswith("V by dim") else fp8_inputs
                if "K by slot" in name:
                    chosen = k_by_slot_inputs
            kv_scales = (k_scale, v_scale) if fp8 else None
            if "scales by slot" in name:
                kv_scales = (k_scale_by_slot, v_scale_by_slot)
            run = functools.partial(decode.decode_attention, *chosen, tiles, kv_scales=kv_scales)
            try:
                with fp8_kv_tiles(tiles_of(name)):
                    us = 1e3 * time_in_graph(lambda i, run=run: run(), copies=36)
            except (OutOfResources, CompilationError) as err:  # e.g. registers: not a candidate
                line.append(f"{name} skipped ({err})")
                continue
            read = fp8_kv_bytes if fp8 else kv_bytes
            rows.append({"point": point, "choice": name, "tiles": vars(tiles), "us": us,
                         "tb_per_s": read / us / 1e6})  # fmt: skip
            line.append(f"{name} {us:.1f}")
        if args.fp8_kv:
            print(f"  {point:>9s} ({kv_bytes / 1e6:7.1f} MB/layer bf16): " + " | ".join(line),
                  flush=True)  # fmt: skip
            del inputs, k_cache, fp8_inputs, by_dim_inputs, k_by_slot_inputs
            torch.cuda.empty_cache()
            continue
        # A verification step of 4 drafts a sequence (5 tokens each, as its graph lays it out):
        # the decode kernel's rows against the extend kernel.
        width = args.verify_width
        query = torch.randn(s * width, args.heads, d, device="cuda", dtype=dtype)
        runs = {
            f"verify x{width}, decode kernel": functools.partial(
                decode.decode_attention, query, *inputs[1:], query_len=width
            ),
            f"verify x{width}, extend kernel": functools.partial(
                kernels.extend_attention,
                query,
                *inputs[1:4],
                torch.arange(0, s * width + 1, width, device="cuda", dtype=torch.int32),
                inputs[4],
                torch.arange(s, device="cuda", dtype=torch.int32),
                torch.zeros(s, device="cuda", dtype=torch.int32),
                d**-0.5,
            ),  # fmt: skip
        }
        for name, run in runs.items():
            us = 1e3 * time_in_graph(lambda i, run=run: run(), copies=36)
            rows.append({"point": point, "choice": name, "us": us,
                         "tb_per_s": kv_bytes / us / 1e6})  # fmt: skip
            line.append(f"{name} {us:.1f}")
        print(f"  {point:>9s} ({kv_bytes / 1e6:7.1f} MB/layer): " + " | ".join(line), flush=True)
        del inputs, k_cache
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
