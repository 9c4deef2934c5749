"""Decode-time GEMMs alone: cuBLAS (torch.matmul) against a Triton kernel for skinny M.

    python scripts/bench_gemm.py                 # w1's projections (Llama-3-8B shape) at M = 32
    python scripts/bench_gemm.py --m 64

At decode, every projection multiplies a few rows (M = running sequences) by a large weight, so
its time is the weight read: effective bandwidth = weight bytes / kernel time. Each timing replays
a CUDA graph of calls over enough distinct weight copies that none is served from L2, so the
figure is what one layer's GEMM costs inside a captured decode step. The Triton kernel here is a
measurement probe (one program per column block, no split-K); it is not used by the engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, N, K) of the Llama-3-8B decoder's projections after fusion, and the LM head.
W1_SHAPES = [
    ("qkv", 6144, 4096),
    ("o_proj", 4096, 4096),
    ("gate_up", 28672, 4096),
    ("down", 4096, 14336),
    ("lm_head", 128256, 4096),
]


L2_BYTES = 64 << 20  # a little above the H200's 50 MB


def _configs():
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bn in (16, 32, 64)
        for bk in (128, 256)
        for w in (4,)
        for s in (3, 4, 6)
    ]


@triton.autotune(configs=_configs(), key=["N", "K"])
@triton.jit
def _skinny_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    n0 = tl.program_id(0) * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=offs_m[:, None] < M)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=offs_n[:, None] < N)
        acc = tl.dot(x, tl.trans(w), acc)
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T for M <= 64 (K a multiple of 256)."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= 64 and k % 256 == 0
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = max(16, triton.next_power_of_2(m))

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    _skinny_kernel[grid](x, weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
                         BLOCK_M=block_m)  # fmt: skip
    return y


def time_in_graph(fn, copies: int, replays: int = 20) -> float:
    """Median milliseconds per call of fn(i) for i over the weight copies, replayed from a graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(copies):  # warm-up: autotuning, library handles
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


def measure_shape(name: str, n: int, k: int, m: int) -> dict:
    weight_bytes = n * k * 2
    copies = max(2, -(-4 * L2_BYTES // weight_bytes))  # together well past the L2 cache
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    want = (x @ weights[0].T).float()
    got = skinny_matmul(x, weights[0]).float()
    row = {
        "name": name,
        "n": n,
        "k": k,
        "m": m,
        "rel_error": ((got - want).norm() / want.norm()).item(),
    }
    for label, fn in (
        ("cublas", lambda i: x @ weights[i].T),
        ("triton", lambda i: skinny_matmul(x, weights[i])),
    ):
        ms = time_in_graph(fn, copies)
        row[f"{label}_ms"] = ms
        row[f"{label}_tb_per_s"] = weight_bytes / ms / 1e9
    row["triton_config"] = str(_skinny_kernel.best_config)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--m", type=int, default=32, help="rows (running sequences)")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gemm.py needs a CUDA device")
    torch.manual_seed(0)
    rows = []
    print(f"decode GEMMs at M = {args.m}, bf16; effective bandwidth = weight bytes / time")
    for name, n, k in W1_SHAPES:
        row = measure_shape(name, n, k, args.m)
        rows.append(row)
        print(
            f"  {name:8s} N={n:6d} K={k:5d}  cuBLAS {row['cublas_ms'] * 1e3:6.1f} us "
            f"{row['cublas_tb_per_s']:.2f} TB/s | Triton {row['triton_ms'] * 1e3:6.1f} us "
            f"{row['triton_tb_per_s']:.2f} TB/s ({row['triton_config']}) | "
            f"rel err {row['rel_error']:.1e}"
        )
        torch.cuda.empty_cache()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"m": args.m, "gemms": rows}, indent=2))


if __name__ == "__main__":
    main()
