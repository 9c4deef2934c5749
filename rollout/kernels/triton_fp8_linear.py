"""The FP8-weight GEMM for decode's few rows: y = (x @ q.T) * scale (+ bias), q in e4m3.

At decode a projection's time is its weight read; FP8 weights halve it. The kernel is
`triton_linear`'s decode GEMM with the weight tile loaded as e4m3 and widened to the activations'
dtype in registers (exactly: e4m3 fits in bf16), the per-output-channel scale applied once to
each fp32 accumulator column at the end. With more rows than MAX_ROWS (a prefill chunk), or off
CUDA, the weight is dequantized and the GEMM is `F.linear`: the same values (`torch_fp8.py`).
Runs as the custom op `rollout::fp8_linear`, opaque to torch.compile like `decode_linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from rollout.kernels.torch_fp8 import FP8_DTYPE, dequantize_rows
from rollout.kernels.triton_linear import MAX_ROWS, SHARED_MEMORY_BUDGET


@triton.jit
def _fp8_linear_kernel(
    x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = (offs_k < K) | EVEN_K  # no K masking when BLOCK_K divides K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        q = tl.load(
            q_ptr + offs_n[:, None] * stride_qn + offs_k[None, :],
            mask=n_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        acc = tl.dot(x, tl.trans(q.to(x.dtype)), acc)
    acc *= tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


def _tiles(rows: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, stages): decode_linear's shapes with twice the K per tile, since a
    weight tile takes half the bytes (not yet swept on the GPU)."""
    block_n, block_k, stages = (32, 512, 6) if n <= 16384 else (64, 256, 3)
    block_m = max(16, triton.next_power_of_2(rows))
    stage_bytes = block_m * block_k * 2 + block_n * block_k
    return block_n, block_k, max(2, min(stages, SHARED_MEMORY_BUDGET // stage_bytes))


def supported(x: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether the Triton kernel can run this GEMM."""
    return (
        q.is_cuda
        and q.dtype == FP8_DTYPE
        and q.stride(1) == 1
        and x.dtype in (torch.bfloat16, torch.float16)
    )


@torch.library.custom_op("rollout::fp8_linear", mutates_args=())
def fp8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """F.linear(x, q * scale, bias): the Triton kernel when x has at most MAX_ROWS rows on CUDA,
    else the dequantized weight through F.linear."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if rows == 0 or rows > MAX_ROWS or not supported(x, q):
        return F.linear(x, dequantize_rows(q, scale, x.dtype), bias)
    x2 = x.reshape(rows, k).contiguous()
    n = q.shape[0]
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    launch(x2, q, scale, bias, y, *_tiles(rows, n))
    return y.view(*x.shape[:-1], n)


def launch(x, q, scale, bias, y, block_n: int, block_k: int, stages: int) -> None:
    """y[M, N] = (x[M, K] @ q[N, K].T) * scale[N] (+ bias) with the given tiles."""
    rows, k = x.shape
    n = q.shape[0]
    _fp8_linear_kernel[(triton.cdiv(n, block_n),)](
        x, q, scale, bias if bias is not None else scale, y, rows, n, k,
        x.stride(0), q.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0,
        BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4, num_stages=stages,
    )  # fmt: skip


@fp8_linear.register_fake
def _(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    return x.new_empty(*x.shape[:-1], q.shape[0])
