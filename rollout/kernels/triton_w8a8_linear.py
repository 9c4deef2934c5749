"""A GEMM over FP8 activations and FP8 weights (EngineConfig.activation_quantization="fp8" or
"fp8-group"): x8 [M, K] in e4m3 with a power-of-two scale per row (or per row and 128 of K), and
the product on the tensor cores with both operands as stored: Hopper's FP8 MMA (wgmma) for
64-row blocks, fp16 MMAs over operands converted from e4m3 (one instruction a pair, exact) for
smaller ones, as Triton compiles them.

It is `triton_linear`'s decode GEMM with its `X_FP8` path; this module picks that launch's tiles
and serves it as the custom op `rollout::w8a8_linear`, at 1 to W8A8_MAX_ROWS rows, but for the
wide outputs (gate/up) from LIBRARY_MIN_ROWS rows, which torch's own FP8 GEMM serves faster. At
1-16 rows it is 2-10% faster than the FP8-weight kernel over the dequantized rows for q/k/v, o
and down, 1-5% slower for gate/up (bench_gemm.py --w8a8 on one H200; docs/performance.md,
'W8A8: the FP8-MMA kernel at one to sixteen rows').
"""

from __future__ import annotations

import torch

from rollout.kernels import triton_linear
from rollout.kernels.gpu_features import (
    has_e4m3_instructions,
    shared_memory_per_program,
    sm_count,
)
from rollout.kernels.linear_residual import check_residual, plus_residual, residual_rows
from rollout.kernels.tiling import W8A8_MAX_ROWS
from rollout.kernels.torch_fp8 import ACTIVATION_GROUP, dequantize_groups, dequantize_rows
from rollout.kernels.triton_import import triton

# 64 x 256 tiles of x and of the weight, e4m3, in six stages: one program an SM
_DEEP_TILES = (64, 256, 6, 1, 4)
_DEEP_TILES_BYTES = (64 + 64) * 256 * 6


def _fp8_mma_tiles(
    rows: int, n: int, k: int, grouped: bool = False, device: torch.device | None = None
) -> tuple[tuple[int, ...], int]:
    """((BLOCK_N, BLOCK_K, stages, K split, warps), BLOCK_M), from bench_gemm.py --w8a8's sweeps
    of Qwen3-8B's shapes (one H200, and one H100 from 33 rows). At up to 32 rows:
    `_few_rows_tiles`. From 33 rows with a scale a row, a narrow output whose 64 x 64 blocks fit
    one wave of `device`'s SMs (o and down up to 128 rows, q/k/v up to 64): one deep program an
    SM, 256-wide K tiles in 6 stages, unsplit (`_DEEP_TILES`; us at 64 / 128 rows on one H100,
    against the tiles below: o 13.7 / 12.9 -> 11.1 / 11.1, down 33.4 / 33.4 -> 25.0 / 27.0,
    q/k/v 14.3 -> 13.0 at 64). Otherwise 64-column blocks in row blocks of up to 64; K split
    until the launch has enough programs (more at up to 32 rows, where each does less), and in
    one row block until no slice is longer than 4,096; deep pipelines for the narrow outputs'
    unsplit or halved K. Wide outputs at more than 64 rows: 128 x 128 blocks, each weight tile
    read once for all rows; with a scale per row and K tile (`grouped`) in 8 warps, as 4 spill
    there (compiled for sm_90: 255 registers and 55 spilled loads a K step against 177 and none;
    not timed)."""
    wide = n >= triton_linear.FP8_MIN_COLUMNS
    if wide and rows > 64:
        return (128, 128, 3, 1, 8 if grouped else 4), 128
    if rows <= 32:
        return _few_rows_tiles(n, k, grouped), triton_linear.row_block(rows)
    if (
        not grouped
        and not wide
        and device is not None
        and triton.cdiv(n, 64) * triton.cdiv(rows, 64) <= sm_count(device)
        and shared_memory_per_program(device) >= _DEEP_TILES_BYTES
    ):
        return _DEEP_TILES, 64
    block_n, block_k, block_m = 64, 128, min(64, triton_linear.row_block(rows))
    programs = 256 if rows <= 32 else 96
    row_blocks = triton.cdiv(rows, block_m)
    split_k = 1
    while split_k < 8 and (
        triton.cdiv(n, block_n) * split_k * row_blocks < programs
        or (row_blocks == 1 and k // split_k > 4096)
    ):
        split_k *= 2
    stages = 5 if not wide and split_k <= 2 else 3
    return (block_n, block_k, stages, split_k, 4), block_m


def _few_rows_tiles(n: int, k: int, grouped: bool = False) -> tuple[int, ...]:
    """The tail's and the crowded middle's tiles (1-32 rows), from
    `bench_gemm.py --w8a8 --w8a8-narrow` at 1, 8 and 32 rows: each the best summed over the three.
    A K split costs its ordered sum (~2 us a launch, `--launch-floor`), so the narrow outputs
    get their programs from 16-column blocks in 2 warps instead, each over 256-wide K tiles;
    only a long K (down's 12,288) is split, in two. Against the tiles before (64 columns, K split
    in four), us at 1 / 8 / 32 rows: q/k/v 12.0 / 12.2 / 14.7 -> 11.4 / 11.5 / 13.9, o 9.7 /
    10.2 / 11.2 -> 9.2 / 9.2 / 10.5, gate/up 30.5 / 30.3 / 33.0 -> 29.2 / 28.6 / 30.1, down 21.1
    / 22.2 / 24.4 -> 19.1 / 20.2 / 23.2. With a scale per 128 inputs (`grouped`) the K tiles
    are the groups' 128, in 6 stages: the sweep's best 128-wide choices (a scale a row: q/k/v
    11.6 / 12.1 / 14.3, o 9.6 / 9.7 / 10.8, down 20.7 / 21.4 / 26.7; the grouped launch itself
    not timed with them)."""
    if n >= triton_linear.FP8_MIN_COLUMNS:
        return 64, 128, 4, 1, 4
    block_k, stages = (128, 6) if grouped else (256, 4)
    if k > 4096:
        return 32, block_k, stages, 2, 4
    return 16, block_k, stages, 1, 2


@torch.library.custom_op("rollout::w8a8_linear", mutates_args=())
def w8a8_linear(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    fp8_weight: torch.Tensor,
    fp8_scale: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """(residual +) F.linear(x8 * x_scale, weight, bias) in weight's dtype, where x8 [..., K] is
    e4m3 with a power-of-two scale per row (x_scale [...], `torch_fp8.quantize_rows`) or per row
    and 128 of K (x_scale [..., ceil(K / 128)], `torch_fp8.quantize_groups`) and weight ==
    fp8_weight * fp8_scale: by the FP8-MMA kernel at up to W8A8_MAX_ROWS rows of bf16 or fp16 (a
    wide output from LIBRARY_MIN_ROWS rows by torch's FP8 GEMM, `library_gemm_pays`), else
    `triton_linear.decode_linear` over the dequantized activations, which are exact in bf16 (the
    FP8-weight kernel at a few rows, F.linear at more). All compute the same products; only the
    summation order differs (and the MMA's, which adds each 128 of K at its own precision before
    taking the sum into fp32). `residual` (the output's shape) is added as
    `triton_linear.decode_linear` adds it: in the kernel's last step where the kernel runs."""
    k = x8.shape[-1]
    rows = x8.numel() // k if k else 0
    check_residual(residual, x8.shape[:-1], weight.shape[0], "w8a8_linear")
    grouped = x_scale.shape != x8.shape[:-1]
    if grouped and x_scale.shape != (*x8.shape[:-1], triton.cdiv(k, ACTIVATION_GROUP)):
        raise ValueError(
            f"w8a8_linear: x_scale {tuple(x_scale.shape)} for x8 {tuple(x8.shape)}: one scale a "
            f"row, or one a row and {ACTIVATION_GROUP} of K"
        )
    if (
        not 0 < rows <= W8A8_MAX_ROWS
        or weight.dtype not in (torch.bfloat16, torch.float16)
        or not triton_linear.supported(fp8_weight)
        or not has_e4m3_instructions(x8.device)
    ):
        # the rounded rows, exact in weight's dtype, through the FP8-weight kernel where that
        # pays (a GPU without the FP8 MMA, fp32), else F.linear (prefill)
        x = (dequantize_groups if grouped else dequantize_rows)(x8, x_scale, weight.dtype)
        return triton_linear.decode_linear(x, weight, bias, fp8_weight, fp8_scale, False, residual)
    n = weight.shape[0]
    if library_gemm_pays(rows, n, k, grouped, residual, weight.dtype, bias, fp8_scale, x8.device):
        return _library_gemm(x8, x_scale, bias, fp8_weight, fp8_scale).view(*x8.shape[:-1], n)
    y = torch.empty(rows, n, dtype=weight.dtype, device=x8.device)
    tiles, block_m = _fp8_mma_tiles(rows, n, k, grouped, x8.device)
    x_scale = x_scale.reshape(rows, -1) if grouped else x_scale.reshape(rows)
    r2, residual = residual_rows(residual, rows, n, y.dtype)
    triton_linear.launch(  # by the module: tests count its launches
        x8.reshape(rows, k).contiguous(), fp8_weight, bias, y, *tiles,
        scale=fp8_scale, x_scale=x_scale.float().contiguous(), block_m=block_m, residual=r2,
    )  # fmt: skip
    return plus_residual(y.view(*x8.shape[:-1], n), residual)


LIBRARY_MIN_ROWS = 65
"""From this many rows a wide output (gate/up: at least FP8_MIN_COLUMNS) with a scale a row goes
to torch's FP8 GEMM (`torch._scaled_mm` with a scale a row of each operand) rather than the
FP8-MMA kernel, whose second 64-row block costs more there; 0 turns the route off. Measured by
bench_gemm.py --w8a8-routes 64,96,128 on one H100: 6.5-8.7 us a layer faster at 96-128 rows,
6 us slower at 64 (docs/performance.md, 'W8A8: gate/up on torch's FP8 GEMM')."""


def library_gemm_pays(
    rows: int, n: int, k: int, grouped: bool, residual, dtype: torch.dtype, bias, fp8_scale,
    device: torch.device,
) -> bool:  # fmt: skip
    """Whether `w8a8_linear`'s launch at `rows` goes to torch's FP8 GEMM: LIBRARY_MIN_ROWS to
    W8A8_MAX_ROWS rows (more are prefill's, served by F.linear), a wide output, a scale a row of
    x and of the weight (the library scales whole rows), no residual to add, bf16 out (its only
    output type with row scales), the shapes it takes (K and N in multiples of 16), on a Hopper
    or later GPU (where its kernel with row scales is built)."""
    return (
        LIBRARY_MIN_ROWS > 0
        and LIBRARY_MIN_ROWS <= rows <= W8A8_MAX_ROWS
        and n >= triton_linear.FP8_MIN_COLUMNS
        and not grouped
        and residual is None
        and dtype == torch.bfloat16
        and (bias is None or bias.dtype == torch.bfloat16)
        and k % 16 == 0
        and n % 16 == 0
        and fp8_scale.numel() == n
        and torch.cuda.get_device_capability(device) >= (9, 0)
    )


def _library_gemm(x8, x_scale, bias, fp8_weight, fp8_scale) -> torch.Tensor:
    """x8 [..., K] e4m3 times the e4m3 weight [N, K] (read as its transpose, column-major, as the
    library wants it), each product scaled by its row's and its output's scale, in bf16."""
    k = x8.shape[-1]
    rows = x8.numel() // k
    return torch._scaled_mm(
        x8.reshape(rows, k).contiguous(),
        fp8_weight.t(),
        x_scale.reshape(rows, 1).float().contiguous(),
        fp8_scale.reshape(1, -1).float().contiguous(),
        bias=bias,
        out_dtype=torch.bfloat16,
    )


@w8a8_linear.register_fake
def _(x8, x_scale, weight, bias, fp8_weight, fp8_scale, residual=None) -> torch.Tensor:
    return x8.new_empty(*x8.shape[:-1], weight.shape[0], dtype=weight.dtype)
