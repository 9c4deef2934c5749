"""Decode-time GEMMs alone: cuBLAS (torch.matmul) against our Triton decode_linear kernel, over
the bf16 weight and over its FP8 form (e4m3, a scale per output row).

    python benchmarks/bench_gemm.py                 # w1's projections (Llama-3-8B shape) at M = 32
    python benchmarks/bench_gemm.py --m 64 --sweep  # also try every tile choice of the Triton kernel
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 8
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 64 --fp8-sweep  # FP8 tile choices only
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 8 --l2-prefetch 10  # FP8 weights in L2
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 64 --scaled-mm  # the library's FP8 GEMM
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 64 --w8a8  # FP8 activations too (w8a8_linear)
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 8 --profile-fp8 qkv  # launches, for ncu
    python benchmarks/bench_gemm.py --shapes qwen3-8b --m 1 --launch-floor  # what does not scale

The FP8 kernel is timed twice: widening e4m3 through `triton_fp8_widen`'s integer path (the
engine's) and through Triton's own cast (`..._cast`), whose outputs must agree bit for bit.

At decode, every projection multiplies a few rows (M = running sequences) by a large weight, so
its time is the weight read: effective bandwidth = weight bytes / kernel time. Each timing replays
a CUDA graph of calls over enough distinct weight copies that none is served from L2, so the
figure is what one layer's GEMM costs inside a captured decode step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, N, K) of the Llama-3-8B decoder's projections after fusion, and the LM head.
W1_SHAPES = [
    ("qkv", 6144, 4096),
    ("o_proj", 4096, 4096),
    ("gate_up", 28672, 4096),
    ("down", 4096, 14336),
    ("lm_head", 128256, 4096),
]
# ... and of Qwen3-8B's (its LM head stays bf16 with FP8 weights).
QWEN3_8B_SHAPES = [
    ("qkv", 6144, 4096),
    ("o_proj", 4096, 4096),
    ("gate_up", 24576, 4096),
    ("down", 4096, 12288),
    ("lm_head", 151936, 4096),
]
SHAPES = {"w1": W1_SHAPES, "qwen3-8b": QWEN3_8B_SHAPES}
L2_BYTES = 64 << 20  # a little above the H200's 50 MB
# (BLOCK_N, BLOCK_K, stages, split_k, warps): split_k > 1 slices K over that many programs
SWEEP = list(itertools.product((32, 64), (128, 256), (4, 6), (1, 2, 4), (4,)))
FP8_SWEEP = list(itertools.product((16, 32, 64), (128, 256, 512), (3, 4, 6), (1, 2, 4, 8), (4,)))
FP8_SWEEP += list(itertools.product((32, 64), (256, 512), (4,), (1, 2, 4), (8,)))
# --fp8-sweep: the FP8 kernel's choices alone, fewer of them, at 8 to 128 rows
FP8_ROWS_SWEEP = list(itertools.product((32, 64), (128, 256), (3, 4), (1, 2, 4), (4, 8)))


def time_in_graph(fn, copies: int, replays: int = 20) -> float:
    """Median milliseconds per call of fn(i) for i over the weight copies, replayed from a graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # fn's inputs were made on the default stream
    with torch.cuda.stream(stream):
        for i in range(copies):  # warm-up: kernel compilation, library handles
            fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(copies):
            fn(i)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / copies)
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def widening_by_cast(on: bool = True):
    """FP8 launches inside widen e4m3 by Triton's cast instead of triton_fp8_widen's integer path
    (the two give the same values; the graph keeps the variant it captured)."""
    from rollout.kernels import triton_fp8_widen

    before = triton_fp8_widen.FAST_WIDEN
    triton_fp8_widen.FAST_WIDEN = before and not on
    try:
        yield
    finally:
        triton_fp8_widen.FAST_WIDEN = before


def _rounded_weights(n: int, k: int, copies: int) -> tuple[list, list]:
    """`copies` random bf16 weights [n, k], each rounded to its FP8 value, and their FP8 forms
    (e4m3, scale per row)."""
    import torch

    from rollout.kernels.torch_fp8 import FP8_DTYPE, round_to_fp8_

    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    fp8 = []
    for w in weights:
        q, scale = torch.empty(n, k, device="cuda", dtype=FP8_DTYPE), torch.empty(n, device="cuda")
        round_to_fp8_(w, q, scale)
        fp8.append((q, scale))
    return weights, fp8


def profile_fp8(name: str, n: int, k: int, m: int, launches: int = 8) -> None:
    """The engine's FP8 kernel for one projection, `launches` times, each over another copy of
    the weight (cold in L2), and nothing else: for a profiler that picks launches by kernel name
    (`gpu_fp8.sh profile-gemm`: ncu with --launch-skip, so the first launches compile and warm)."""
    import torch

    from rollout.kernels import triton_linear

    copies = max(2, -(-4 * L2_BYTES // (n * k)))
    _, fp8 = _rounded_weights(n, k, copies)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    tiles = triton_linear._tiles(m, n, 1)
    for i in range(launches):
        q, scale = fp8[i % copies]
        triton_linear.launch(x, q, None, y, *tiles, scale=scale)
    torch.cuda.synchronize()
    print(f"  {name}: {launches} launches of the FP8 kernel at M = {m}, tiles {tiles}")


def _scaled_mm_call(x, fp8):
    """torch._scaled_mm over the FP8 weights with x itself rounded to e4m3 (a scale per row):
    the library's FP8 tensor-core GEMM, FP8 activations and all (a different model; timed as
    what a vendor FP8 GEMM costs at these rows)."""
    import torch

    from rollout.kernels.torch_fp8 import quantize_rows

    x8, x_scale = quantize_rows(x)
    x_scale = x_scale.view(-1, 1)
    scales = [s.view(1, -1) for _, s in fp8]
    return lambda i: torch._scaled_mm(
        x8, fp8[i][0].t(), x_scale, scales[i], out_dtype=torch.bfloat16
    )


def measure_shape(
    name: str, n: int, k: int, m: int, sweep: str, scaled_mm: bool = False, w8a8: bool = False,
    w8a8_narrow: bool = False,
) -> dict:  # fmt: skip
    """One projection's timings; `sweep`: "" (the engine's tiles only), "all" (every tile choice
    of both kernels) or "fp8" (FP8_ROWS_SWEEP); `scaled_mm`: torch._scaled_mm too; `w8a8`: the
    engine's W8A8 GEMM, and the best of W8A8_SWEEP (of W8A8_NARROW_SWEEP with `w8a8_narrow`)."""
    import torch

    from rollout.kernels import triton_linear

    weight_bytes = n * k * 2
    copies = max(2, -(-4 * L2_BYTES // weight_bytes))  # together well past the L2 cache
    weights, fp8 = _rounded_weights(n, k, copies)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    want = (x @ weights[0].T).float()
    y8 = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def fp8_kernel(i):  # the FP8 kernel at its tiles, wherever the engine would use it or not
        q, scale = fp8[i]
        triton_linear.launch(x, q, None, y8, *triton_linear._tiles(m, n, 1), scale=scale)
        return y8

    def rel_error(got):
        return ((got.float() - want).norm() / want.norm()).item()

    fp8_out = fp8_kernel(0).clone()
    with widening_by_cast():
        cast_out = fp8_kernel(0).clone()
    row = {
        "name": name,
        "n": n,
        "k": k,
        "m": m,
        "rel_error": rel_error(triton_linear.decode_linear(x, weights[0], None)),
        "fp8_rel_error": rel_error(fp8_out),
        "fp8_widenings_agree": bool(torch.equal(fp8_out, cast_out)),
    }
    candidates = [
        ("cublas", weight_bytes, lambda i: x @ weights[i].T, False),
        ("triton", weight_bytes, lambda i: triton_linear.decode_linear(x, weights[i], None), False),
        ("triton_fp8", n * k + 4 * n, fp8_kernel, False),
        ("triton_fp8_cast", n * k + 4 * n, fp8_kernel, True),
    ]
    if scaled_mm:
        candidates.append(("scaled_mm", n * k + 4 * n, _scaled_mm_call(x, fp8), False))
    for label, nbytes, fn, by_cast in candidates:
        with widening_by_cast(by_cast):
            try:
                ms = time_in_graph(fn, copies)
            except RuntimeError as err:  # e.g. a row count the FP8 library GEMM refuses
                if label != "scaled_mm":
                    raise
                row[f"{label}_error"] = str(err)[:200]
                continue
        row[f"{label}_ms"] = ms
        row[f"{label}_tb_per_s"] = nbytes / ms / 1e9
    if w8a8:
        row.update(_measure_w8a8(x, fp8, want, copies, w8a8_narrow))
    if sweep:
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        sweeps = [
            ("sweep", SWEEP, lambda i, t: triton_linear.launch(x, weights[i], None, y, *t)),
            (
                "fp8_sweep",
                FP8_SWEEP if sweep == "all" else FP8_ROWS_SWEEP,
                lambda i, t: triton_linear.launch(x, fp8[i][0], None, y, *t, scale=fp8[i][1]),
            ),
        ]
        for key, tile_choices, launch_with in sweeps[1:] if sweep == "fp8" else sweeps:
            timed = {}
            for tiles in tile_choices:
                try:
                    timed[tiles] = time_in_graph(lambda i, t=tiles, f=launch_with: f(i, t), copies)
                except Exception:  # noqa: BLE001 - e.g. out of shared memory: not a candidate
                    continue
            best = min(timed, key=timed.get)
            unsplit = min((t for t in timed if t[3] == 1), key=timed.get)
            row[f"{key}_best"] = {"tiles": list(best), "ms": timed[best]}
            row[f"{key}_best_unsplit"] = {"tiles": list(unsplit), "ms": timed[unsplit]}
            row[f"{key}_all"] = [[*t, round(ms * 1e3, 2)] for t, ms in sorted(timed.items())]
    return row


# FP8-MMA tile choices --w8a8 times beside the engine's own (BLOCK_N, BLOCK_K, stages, K split,
# warps, BLOCK_M): the sweep its choice in triton_w8a8_linear._fp8_mma_tiles came from.
W8A8_SWEEP = [
    (bn, 128, stages, split, 4, bm)
    for bm in (32, 64, 128)
    for bn in (64, 128)
    for split in (1, 2, 4, 8)
    for stages in (3, 5)
]
# --w8a8-narrow: narrower column blocks, longer K tiles, deeper pipelines and 2 warps at the
# rows' own row block: enough programs without a K split (whose ordered sum is a fixed ~2 us a
# launch: --launch-floor) for the tail's and the crowded middle's few rows
W8A8_NARROW_SWEEP = list(itertools.product((16, 32, 64), (128, 256), (4, 6, 8), (1, 2), (2, 4)))


def _measure_w8a8(x, fp8, want, copies: int, narrow: bool = False) -> dict:
    """The engine's W8A8 GEMM (`triton_w8a8_linear.w8a8_linear`: x rounded to e4m3 with a scale
    per row, then with one per row and 128 of K) at its tiles, its error against the fp32 GEMM of
    its rounded operands and against bf16 (the activations' rounding as well), and the best of
    W8A8_SWEEP (row blocks up to the rows' power of two, and of 64 at fewer rows: Triton takes
    Hopper's FP8 wgmma only from 64-row blocks, and compiles smaller ones to fp16 MMAs over
    operands converted from e4m3); with `narrow`, W8A8_NARROW_SWEEP at the engine's row block."""
    import torch
    import triton

    from rollout.kernels import triton_linear, triton_w8a8_linear
    from rollout.kernels.torch_fp8 import (
        dequantize_groups,
        dequantize_rows,
        quantize_groups,
        quantize_rows,
    )

    m, n = x.shape[0], fp8[0][0].shape[0]
    x8, x_scale = quantize_rows(x)
    weight = dequantize_rows(*fp8[0], torch.bfloat16)
    got = triton_w8a8_linear.w8a8_linear(x8, x_scale, weight, None, *fp8[0]).float()
    twin = dequantize_rows(x8, x_scale, torch.float32) @ weight.float().T
    row = {
        "w8a8_ms": time_in_graph(
            lambda i: triton_w8a8_linear.w8a8_linear(x8, x_scale, weight, None, *fp8[i]), copies
        ),
        "w8a8_error_to_twin": ((got - twin).norm() / twin.norm()).item(),
        "w8a8_rel_error": ((got - want).norm() / want.norm()).item(),
    }
    # the same with a scale per row and 128 of K (activation_quantization="fp8-group")
    g8, g_scale = quantize_groups(x)
    got = triton_w8a8_linear.w8a8_linear(g8, g_scale, weight, None, *fp8[0]).float()
    twin = dequantize_groups(g8, g_scale, torch.float32) @ weight.float().T
    row |= {
        "w8a8_groups_ms": time_in_graph(
            lambda i: triton_w8a8_linear.w8a8_linear(g8, g_scale, weight, None, *fp8[i]), copies
        ),
        "w8a8_groups_error_to_twin": ((got - twin).norm() / twin.norm()).item(),
        "w8a8_groups_rel_error": ((got - want).norm() / want.norm()).item(),
    }
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    timed = {}
    block_m = triton_w8a8_linear._fp8_mma_tiles(m, n, x.shape[1], device=x.device)[1]
    sweep = [(*t, block_m) for t in W8A8_NARROW_SWEEP] if narrow else W8A8_SWEEP
    for tiles in sweep:
        if tiles[-1] > max(64, triton.next_power_of_2(m)):
            continue
        try:
            timed[tiles] = time_in_graph(
                lambda i, t=tiles: triton_linear.launch(
                    x8,
                    fp8[i][0],
                    None,
                    y,
                    *t[:-1],
                    scale=fp8[i][1],
                    x_scale=x_scale,
                    block_m=t[-1],
                ),
                copies,
            )
        except Exception:  # noqa: BLE001 - e.g. out of shared memory: not a candidate
            continue
    best = min(timed, key=timed.get)
    row["w8a8_sweep_best"] = {"tiles": list(best), "ms": timed[best]}
    unsplit = min((t for t in timed if t[3] == 1), key=timed.get)
    row["w8a8_sweep_best_unsplit"] = {"tiles": list(unsplit), "ms": timed[unsplit]}
    row["w8a8_sweep_all"] = [[*t, round(ms * 1e3, 2)] for t, ms in sorted(timed.items())]
    return row


def _prefetch_kernel():
    """A Triton kernel that asks the GPU to copy [ptr, ptr + nbytes) from memory into L2 and
    returns at once (`cp.async.bulk.prefetch.L2`: no completion to wait for): 32 threads a
    program, CHUNK bytes each."""
    import triton
    import triton.language as tl

    @triton.jit
    def prefetch_l2(ptr, nbytes, CHUNK: tl.constexpr):
        offs = (tl.program_id(0) * 32 + tl.arange(0, 32)).to(tl.int64) * CHUNK
        size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)
        size = tl.where(size > 0, size, 0)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip

    return prefetch_l2


def measure_prefetch(name: str, n: int, k: int, m: int, sleep_us: float) -> dict:
    """The engine's FP8 GEMM after `sleep_us` of other work that reads no memory: its weight
    cold (each call another copy, from DRAM), asked into L2 before that work (a bulk prefetch),
    or already in L2 (one copy, if it fits). The time of the work alone is subtracted."""
    import torch
    import triton

    from rollout.kernels import triton_linear

    copies = max(2, -(-4 * L2_BYTES // (n * k)))  # the FP8 copies together well past L2
    _, fp8 = _rounded_weights(n, k, copies)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    tiles = triton_linear._tiles(m, n, 1)
    cycles = int(sleep_us * torch.cuda.get_device_properties(0).clock_rate / 1e3)
    chunk = 16384
    prefetch = _prefetch_kernel()

    def gemm(i):
        triton_linear.launch(x, fp8[i][0], None, y, *tiles, scale=fp8[i][1])

    def work():
        torch.cuda._sleep(cycles)

    def ask(i):
        q = fp8[i][0]
        prefetch[(triton.cdiv(q.numel(), 32 * chunk),)](q, q.numel(), CHUNK=chunk, num_warps=1)

    alone = time_in_graph(lambda i: work(), copies)
    return {
        "name": name, "n": n, "k": k, "m": m, "sleep_us": sleep_us,
        "work_alone_ms": alone,
        "cold_ms": time_in_graph(lambda i: (work(), gemm(i)), copies) - alone,
        "prefetched_ms": time_in_graph(lambda i: (ask(i), work(), gemm(i)), copies) - alone,
        "hot_ms": time_in_graph(lambda i: (work(), gemm(0)), copies) - alone,
        "prefetch_alone_ms": time_in_graph(ask, copies),
    }  # fmt: skip


def _store_one_kernel():
    """A Triton kernel whose programs each store their index and nothing else: the launch alone."""
    import triton
    import triton.language as tl

    @triton.jit
    def store_one(out_ptr):
        pid = tl.program_id(0) + tl.num_programs(0) * (
            tl.program_id(1) + tl.num_programs(1) * tl.program_id(2)
        )
        tl.store(out_ptr + pid, pid)

    return store_one


def measure_launch_floor(name: str, n: int, k: int, m: int) -> dict:
    """What of a few-row GEMM's time does not grow with its weight. For the FP8-weight kernel
    over bf16 rows and the FP8-MMA kernel over e4m3 rows (W8A8), each at the engine's tiles: the
    whole launch (weights cold), the same launch over one K tile a program (its launch, first
    loads, the K split's ordered sum and the stores), and a kernel of the same grid and warps
    whose programs only store their index (the launch itself); each in a graph of back-to-back
    launches, as a decode step runs them. "rest_tb_per_s" is the weight beyond that one tile
    over the time beyond it."""
    import torch
    import triton

    from rollout.kernels import triton_linear, triton_w8a8_linear
    from rollout.kernels.torch_fp8 import quantize_rows

    copies = max(2, -(-4 * L2_BYTES // (n * k)))
    _, fp8 = _rounded_weights(n, k, copies)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x8, x_scale = quantize_rows(x)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    store_one = _store_one_kernel()
    mma_tiles, mma_block_m = triton_w8a8_linear._fp8_mma_tiles(m, n, k, device=x.device)
    row = {"name": name, "n": n, "k": k, "m": m}
    for label, rows_in, tiles, block_m, x_scales in (
        ("fp8_weights", x, triton_linear._tiles(m, n, 1), triton_linear.row_block(m), None),
        ("w8a8", x8, mma_tiles, mma_block_m, x_scale),
    ):
        block_n, block_k, _, split_k, warps = tiles
        short_k = block_k * split_k

        def gemm(i, rows, tiles=tiles, block_m=block_m, x_scales=x_scales):
            # the weight's first rows.shape[1] columns, read through its full row stride
            triton_linear.launch(
                rows, fp8[i][0][:, : rows.shape[1]], None, y, *tiles, scale=fp8[i][1],
                x_scale=x_scales, block_m=block_m,
            )  # fmt: skip

        grid = (triton.cdiv(n, block_n), split_k, triton.cdiv(m, block_m))
        out = torch.empty(grid[0] * grid[1] * grid[2], device="cuda", dtype=torch.int32)
        short_rows = rows_in[:, :short_k].contiguous()
        full = time_in_graph(lambda i, r=rows_in: gemm(i, r), copies)
        one_tile = time_in_graph(lambda i, r=short_rows: gemm(i, r), copies)
        empty = time_in_graph(
            lambda i, g=grid, o=out, w=warps: store_one[g](o, num_warps=w), copies
        )
        row[label] = {
            "tiles": [*tiles, block_m], "grid": list(grid), "full_ms": full,
            "one_k_tile_ms": one_tile, "empty_grid_ms": empty,
            "rest_tb_per_s": (k - short_k) * n / max(full - one_tile, 1e-9) / 1e9,
        }  # fmt: skip
    return row


def measure_w8a8_routes(name: str, n: int, k: int, row_counts: list[int]) -> list[dict]:
    """One output's W8A8 GEMM (x rounded with a scale a row) at each of `row_counts` by both of
    the engine's routes: the FP8-MMA kernel at its tiles and torch's FP8 GEMM
    (`triton_w8a8_linear._library_gemm`), beside cuBLAS bf16; each output checked against the
    fp32 GEMM of the rounded operands."""
    import torch

    from rollout.kernels import triton_w8a8_linear
    from rollout.kernels.torch_fp8 import dequantize_rows, quantize_rows

    copies = max(2, -(-4 * L2_BYTES // (n * k * 2)))
    weights, fp8 = _rounded_weights(n, k, copies)
    results = []
    for m in row_counts:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        x8, x_scale = quantize_rows(x)
        twin = dequantize_rows(x8, x_scale, torch.float32) @ weights[0].float().T

        def kernel(i, x8=x8, x_scale=x_scale):  # the FP8-MMA kernel, whatever the route
            before, triton_w8a8_linear.LIBRARY_MIN_ROWS = triton_w8a8_linear.LIBRARY_MIN_ROWS, 0
            try:
                return triton_w8a8_linear.w8a8_linear(x8, x_scale, weights[i], None, *fp8[i])
            finally:
                triton_w8a8_linear.LIBRARY_MIN_ROWS = before

        def library(i, x8=x8, x_scale=x_scale):
            return triton_w8a8_linear._library_gemm(x8, x_scale, None, *fp8[i])

        row = {"name": name, "n": n, "k": k, "m": m}
        for label, fn in (("kernel", kernel), ("library", library)):
            error = (fn(0).float() - twin).norm() / twin.norm()
            row[f"{label}_ms"] = time_in_graph(fn, copies)
            row[f"{label}_error_to_twin"] = error.item()
        row["cublas_bf16_ms"] = time_in_graph(lambda i, x=x: x @ weights[i].T, copies)
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--m", type=int, default=32,
        help="rows (running sequences); the engine's Triton bf16 GEMM takes at most 64 (cuBLAS above)",
    )  # fmt: skip
    parser.add_argument("--sweep", action="store_true", help="time every tile choice too")
    parser.add_argument(
        "--fp8-sweep",
        action="store_true",
        help="time the FP8 kernel's tile choices (FP8_ROWS_SWEEP)",
    )
    parser.add_argument(
        "--l2-prefetch",
        type=float,
        default=0.0,
        metavar="US",
        help="time the FP8 GEMMs after US microseconds of other work: weights cold, asked into "
        "L2 before that work, or already there",
    )
    parser.add_argument(
        "--scaled-mm",
        action="store_true",
        help="time torch._scaled_mm too (FP8 weights and activations, a scale per row of each)",
    )
    parser.add_argument(
        "--w8a8",
        action="store_true",
        help="time the engine's W8A8 GEMM too (activation_quantization='fp8': FP8 activations "
        "with a scale per row, on the FP8-MMA kernel at up to 128 rows) and its tile choices",
    )
    parser.add_argument(
        "--w8a8-narrow",
        action="store_true",
        help="with --w8a8: time W8A8_NARROW_SWEEP's tile choices (narrow column blocks, deep "
        "pipelines, 2 or 4 warps) instead of W8A8_SWEEP's",
    )
    parser.add_argument(
        "--launch-floor",
        action="store_true",
        help="time what of the FP8 and W8A8 GEMMs does not grow with the weight: the launch over "
        "one K tile a program, and an empty launch of the same grid",
    )
    parser.add_argument(
        "--profile-fp8",
        default="",
        metavar="NAME",
        help="only launch the engine's FP8 kernel for projection NAME (e.g. qkv), for a profiler",
    )
    parser.add_argument(
        "--w8a8-routes",
        default="",
        metavar="ROWS",
        help="time each output's W8A8 GEMM at these rows (comma-separated) by the FP8-MMA kernel "
        "and by torch's FP8 GEMM, beside cuBLAS bf16 (triton_w8a8_linear.LIBRARY_MIN_ROWS)",
    )
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="w1")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.w8a8_narrow and not args.w8a8:
        parser.error("--w8a8-narrow sweeps the W8A8 GEMM's tiles: give --w8a8 too")

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gemm.py needs a CUDA device")
    torch.manual_seed(0)
    if args.profile_fp8:
        shapes = {name: (n, k) for name, n, k in SHAPES[args.shapes]}
        if args.profile_fp8 not in shapes:
            sys.exit(f"--profile-fp8 {args.profile_fp8!r}: one of {', '.join(shapes)}")
        profile_fp8(args.profile_fp8, *shapes[args.profile_fp8], args.m)
        return
    rows = []
    print(
        f"decode GEMMs of {args.shapes} at M = {args.m}, bf16 activations; effective bandwidth ="
        " weight bytes (bf16, or FP8 + scales) / time"
    )
    if args.l2_prefetch:
        for name, n, k in SHAPES[args.shapes]:
            row = measure_prefetch(name, n, k, args.m, args.l2_prefetch)
            rows.append(row)
            print(
                f"  {name:8s} FP8 after {args.l2_prefetch:.0f} us of work: cold"
                f" {row['cold_ms'] * 1e3:6.1f} us | prefetched {row['prefetched_ms'] * 1e3:6.1f} us"
                f" | in L2 {row['hot_ms'] * 1e3:6.1f} us | the prefetch launch alone"
                f" {row['prefetch_alone_ms'] * 1e3:.1f} us (work alone"
                f" {row['work_alone_ms'] * 1e3:.1f} us)",
                flush=True,
            )
    if args.w8a8_routes:
        row_counts = [int(r) for r in args.w8a8_routes.split(",")]
        for name, n, k in SHAPES[args.shapes]:
            for row in measure_w8a8_routes(name, n, k, row_counts):
                rows.append(row)
                print(
                    f"  {name:8s} M={row['m']:4d}  FP8-MMA kernel {row['kernel_ms'] * 1e3:6.1f} us"
                    f" | torch's FP8 GEMM {row['library_ms'] * 1e3:6.1f} us | cuBLAS bf16"
                    f" {row['cublas_bf16_ms'] * 1e3:6.1f} us | errors to the twin"
                    f" {row['kernel_error_to_twin']:.1e}, {row['library_error_to_twin']:.1e}",
                    flush=True,
                )
            torch.cuda.empty_cache()
    if args.launch_floor:
        for name, n, k in SHAPES[args.shapes]:
            if name == "lm_head":
                continue  # not rounded by W8A8; its read dwarfs any fixed part
            row = measure_launch_floor(name, n, k, args.m)
            rows.append(row)
            for label in ("fp8_weights", "w8a8"):
                r = row[label]
                print(
                    f"  {name:8s} {label:11s} grid {r['grid']}: whole {r['full_ms'] * 1e3:5.1f} us"
                    f" | one K tile a program {r['one_k_tile_ms'] * 1e3:5.1f} us | an empty"
                    f" launch of the grid {r['empty_grid_ms'] * 1e3:4.1f} us | the rest of the"
                    f" weight at {r['rest_tb_per_s']:.2f} TB/s",
                    flush=True,
                )
    only_routes = args.l2_prefetch or args.launch_floor or args.w8a8_routes
    for name, n, k in [] if only_routes else SHAPES[args.shapes]:
        if args.fp8_sweep and name == "lm_head":
            continue  # the engine keeps the LM head in bf16: no FP8 tiles to choose
        row = measure_shape(
            name, n, k, args.m, "all" if args.sweep else "fp8" if args.fp8_sweep else "",
            args.scaled_mm, args.w8a8, args.w8a8_narrow,
        )  # fmt: skip
        rows.append(row)
        line = (
            f"  {name:8s} N={n:6d} K={k:5d}  cuBLAS {row['cublas_ms'] * 1e3:6.1f} us "
            f"{row['cublas_tb_per_s']:.2f} TB/s | Triton {row['triton_ms'] * 1e3:6.1f} us "
            f"{row['triton_tb_per_s']:.2f} TB/s | FP8 {row['triton_fp8_ms'] * 1e3:6.1f} us "
            f"{row['triton_fp8_tb_per_s']:.2f} TB/s ({row['cublas_ms'] / row['triton_fp8_ms']:.2f}x"
            f" cuBLAS; by cast {row['triton_fp8_cast_ms'] * 1e3:.1f} us"
            f"{'' if row['fp8_widenings_agree'] else ', OUTPUTS DIFFER'})"
            f" | rel err {row['rel_error']:.1e}, FP8 {row['fp8_rel_error']:.1e}"
        )
        if "scaled_mm_ms" in row:
            line += f" | torch._scaled_mm {row['scaled_mm_ms'] * 1e3:.1f} us"
        elif "scaled_mm_error" in row:
            line += f" | torch._scaled_mm refused: {row['scaled_mm_error'][:80]}"
        if "w8a8_ms" in row:
            line += (
                f" | W8A8 {row['w8a8_ms'] * 1e3:.1f} us (rel err {row['w8a8_rel_error']:.1e},"
                f" to its twin {row['w8a8_error_to_twin']:.1e}), scales per 128"
                f" {row['w8a8_groups_ms'] * 1e3:.1f} us (rel err"
                f" {row['w8a8_groups_rel_error']:.1e}, to its twin"
                f" {row['w8a8_groups_error_to_twin']:.1e})"
            )
        if "w8a8_sweep_best" in row:
            best_w8a8 = row["w8a8_sweep_best"]
            line += f" | best W8A8 tiles {best_w8a8['tiles']} {best_w8a8['ms'] * 1e3:.1f} us"
            unsplit = row["w8a8_sweep_best_unsplit"]
            line += f" (unsplit {unsplit['tiles']} {unsplit['ms'] * 1e3:.1f} us)"
        if "sweep_best" in row:
            best = row["sweep_best"]
            line += f" | best tiles {best['tiles']} {best['ms'] * 1e3:.1f} us"
        if "fp8_sweep_best" in row:
            best8 = row["fp8_sweep_best"]
            line += f" | best FP8 tiles {best8['tiles']} {best8['ms'] * 1e3:.1f} us"
            line += f" (unsplit {row['fp8_sweep_best_unsplit']['ms'] * 1e3:.1f} us)"
        print(line, flush=True)
        torch.cuda.empty_cache()
    if args.json_out:
        from benchmarks.lib.report import commit_id

        run = {"commit": commit_id(), "date": datetime.date.today().isoformat()}
        run["device"] = torch.cuda.get_device_name()
        Path(args.json_out).write_text(
            json.dumps({**run, "m": args.m, "shapes": args.shapes, "gemms": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
