"""An experiment, not an engine path: FP8 activations times FP8 weights on the tensor cores (W8A8).

`bench_gemm.py --w8a8` times it against bf16 and the engine's FP8 kernel at the crowded steps'
row counts (32-128), where the engine's FP8-weight kernel, which widens the weight to bf16, is
no faster than bf16. Each input row is rounded to e4m3 with a scale of its own (its largest
magnitude over 448), so it is a different model than the engine's FP8 weights: what it would
gain is measured here before any engine mode is built on it.

The kernel: x8 [M, K] and the weight [N, K] in e4m3, one program per (row block, column block,
K piece), the K pieces summed by fp32 atomics (then cast to bf16) when a launch splits K so
that a few row blocks still fill the GPU. The tensor cores' FP8 MMA adds its products at less
than fp32 precision; partial sums are taken into fp32 after every BLOCK_K of K
(`max_num_imprecise_acc`), as FP8 training recipes do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

E4M3_MAX = 448.0


@dataclass(frozen=True)
class W8A8Tiles:
    block_m: int
    block_n: int
    split_k: int
    num_stages: int
    block_k: int = 128
    num_warps: int = 4


# The choices bench_gemm.py --w8a8 times; the best of them is reported.
W8A8_CHOICES = [
    W8A8Tiles(bm, bn, split, stages)
    for bm in (32, 64, 128)
    for bn in (64, 128)
    for split in (1, 2, 4, 8)
    for stages in (3, 5)
]


def fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] rounded to e4m3 with a scale per row (its largest magnitude / 448): (x8, scale)."""
    scale = (x.float().abs().amax(1) / E4M3_MAX).clamp_min(1e-12)
    return (x.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def w8a8_twin(x8, x_scale, w8, w_scale) -> torch.Tensor:
    """The product in fp32 of the dequantized operands: what the kernel computes."""
    return (x8.float() * x_scale[:, None]) @ (w8.float() * w_scale[:, None]).T


@triton.jit
def _w8a8_kernel(
    x_ptr, w_ptr, x_scale_ptr, w_scale_ptr, out_ptr, M, N, K, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows < M
    col_mask = cols < N
    k0 = pid_k * k_per_split
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(k0, k0 + k_per_split, BLOCK_K):
        k_mask = (k + ks) < K
        x = tl.load(
            x_ptr + rows[:, None] * K + (k + ks)[None, :],
            mask=row_mask[:, None] & k_mask[None, :], other=0.0,
        )  # fmt: skip
        w = tl.load(
            w_ptr + cols[:, None] * K + (k + ks)[None, :],
            mask=col_mask[:, None] & k_mask[None, :], other=0.0,
        )  # fmt: skip
        acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=BLOCK_K)
    x_scale = tl.load(x_scale_ptr + rows, mask=row_mask, other=0.0)
    w_scale = tl.load(w_scale_ptr + cols, mask=col_mask, other=0.0)
    acc = acc * x_scale[:, None] * w_scale[None, :]
    ptrs = out_ptr + rows[:, None] * N + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if ATOMIC:
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def w8a8_matmul(x8, x_scale, w8, w_scale, tiles: W8A8Tiles) -> torch.Tensor:
    """x8 [M, K] e4m3 (scale [M]) times w8 [N, K] e4m3 (scale [N]) transposed: [M, N] bf16."""
    m, k = x8.shape
    n = w8.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(k, tiles.split_k), tiles.block_k) * tiles.block_k
    splits = triton.cdiv(k, k_per_split)
    atomic = splits > 1
    out = torch.zeros(m, n, device=x8.device, dtype=torch.float32 if atomic else torch.bfloat16)
    grid = (triton.cdiv(n, tiles.block_n), splits, triton.cdiv(m, tiles.block_m))
    _w8a8_kernel[grid](
        x8, w8, x_scale, w_scale, out, m, n, k, k_per_split,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, ATOMIC=atomic,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.to(torch.bfloat16) if atomic else out
