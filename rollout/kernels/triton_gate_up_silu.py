"""The MLP's gate/up GEMM with silu(gate) * up in its last step, rounded for down's FP8 input, at
decode's fewest rows (up to MAX_ROWS) under FP8 activations with a scale a row
(EngineConfig.activation_quantization "fp8").

Unfused, the activation and its rounding are a launch of one program a row, which must hold the
whole row for its scale: at one to 64 rows a few SMs issue all of its work while the rest wait
(2.9-3.2 us a layer on one H100 against 1.3-1.7 for the same silu * up spread over programs;
docs/performance.md, 'The rounding kernels' own cost'). Here each program of the W8A8 GEMM owns
BLOCK_N columns of gate and the same columns of up, so it can finish silu(gate) * up itself; it
stores that product and its rows' largest magnitude over its columns. A second launch, spread
over (row, chunk) programs, takes each row's largest magnitude from those partial ones and rounds
its chunk. The row's scale is the same as from the whole row at once (a maximum in any order),
the GEMM's columns are those of `triton_linear`'s kernel with the same K tiles, and gate, up, silu
and the product are rounded as the unfused kernels round them (`_finish`, `triton_rounded_rows`).

Run as the custom op `rollout::gate_up_silu_rounded`; off CUDA, under Triton's interpreter, on a
GPU without the FP8 MMA, or where `serves` says no, it computes the unfused ops' composition.
"""

from __future__ import annotations

import torch

from rollout.kernels import (  # noqa: F401 - triton_w8a8_linear registers the unfused GEMM's op
    triton_linear,
    triton_rounded_rows,
    triton_w8a8_linear,
)
from rollout.kernels.gpu_features import has_e4m3_instructions
from rollout.kernels.torch_fp8 import FP8_DTYPE
from rollout.kernels.triton_attention_tiles import pow2_scale
from rollout.kernels.triton_import import tl, triton

MAX_ROWS = 16
"""The most rows the op serves (more take the unfused ops). In grpo on one H100 at up to 64 rows
its steps were 1.0-1.1% shorter at 1-15 running, 0.6-0.9% longer at 16-31 (row blocks of 32),
within 0.3% from 32 (docs/performance.md, 'W8A8: the activation in gate/up's GEMM'). At most
`triton_linear.MAX_ROWS`, where decode's GEMMs are our FP8-MMA kernel's; from 65 rows gate/up
goes to torch's FP8 GEMM, whose last step is not ours."""

ROUND_CHUNK = 1024
"""Inputs of a row one rounding program converts."""


@triton.jit
def _gate_up_silu_kernel(
    x_ptr, w_ptr, ws_ptr, xs_ptr, y_ptr, amax_ptr, M, inter, K, stride_xm, stride_wn, stride_ym,
    stride_am, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < inter
    gate_rows = w_ptr + offs_n[:, None] * stride_wn  # up's rows are `inter` further on
    up_rows = w_ptr + (offs_n + inter)[:, None] * stride_wn
    gate_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    up_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = (offs_k < K) | EVEN_K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w_mask = n_mask[:, None] & k_mask[None, :]
        gate_w = tl.load(gate_rows + offs_k[None, :], mask=w_mask, other=0.0)
        up_w = tl.load(up_rows + offs_k[None, :], mask=w_mask, other=0.0)
        # the FP8 MMA, taken into fp32 every BLOCK_K, as triton_linear's kernel takes it
        gate_acc = tl.dot(x, tl.trans(gate_w), gate_acc, max_num_imprecise_acc=BLOCK_K)
        up_acc = tl.dot(x, tl.trans(up_w), up_acc, max_num_imprecise_acc=BLOCK_K)
    # the scales in `triton_linear._finish`'s order: the column's, then the row's
    x_scale = tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
    gate_acc *= tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    up_acc *= tl.load(ws_ptr + inter + offs_n, mask=n_mask, other=0.0)[None, :]
    dtype = y_ptr.dtype.element_ty
    g = (gate_acc * x_scale).to(dtype).to(tl.float32)
    up = (up_acc * x_scale).to(dtype).to(tl.float32)
    y = triton_rounded_rows.silu_mul(g, up, dtype)  # as the unfused activation rounds it
    mn_mask = m_mask[:, None] & n_mask[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y, mask=mn_mask)
    magnitude = tl.where(mn_mask, tl.abs(y.to(tl.float32)), 0.0)
    tl.store(amax_ptr + offs_m * stride_am + pid_n, tl.max(magnitude, 1), mask=m_mask)


@triton.jit
def _round_by_parts_kernel(
    y_ptr, amax_ptr, q_ptr, s_ptr, inter, parts, stride_y, stride_am, stride_q,
    PARTS: tl.constexpr, CHUNK: tl.constexpr, HW_E4M3: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    p = tl.arange(0, PARTS)
    amax = tl.max(tl.load(amax_ptr + row * stride_am + p, mask=p < parts, other=0.0), 0)
    scale, inverse = pow2_scale(amax)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < inter
    y = tl.load(y_ptr + row * stride_y + offs, mask=mask, other=0.0).to(tl.float32)
    code = triton_rounded_rows.e4m3_codes(y * inverse, HW_E4M3)
    tl.store(q_ptr + row * stride_q + offs, code, mask=mask)
    if chunk == 0:
        tl.store(s_ptr + row, scale)


def tiles(rows: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N of gate and of up, BLOCK_K, stages, warps): the bytes a program of the
    unfused GEMM reads (`triton_w8a8_linear._fp8_mma_tiles` for gate/up: 64 columns, 128-wide K
    tiles, 4 stages to 32 rows, 3 in one 64-row block above), half of them gate's, half up's."""
    if rows <= 32:
        return triton_linear.row_block(rows), 32, 128, 4, 4
    return 64, 32, 128, 3, 4


def launch(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    fp8_weight: torch.Tensor,
    fp8_scale: torch.Tensor,
    dtype: torch.dtype,
    hw: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both launches over x8 [rows, K] (e4m3) with x_scale [rows] and the gate/up weight's FP8
    form fp8_weight [2 * inter, K] = [gate | up] with fp8_scale [2 * inter]: (y, q, scale), y =
    silu(gate) * up [rows, inter] in `dtype`, q and scale its FP8 form. Tests launch it under
    Triton's interpreter; `hw` overrides `triton_rounded_rows.hw_e4m3`."""
    rows, k = x8.shape
    inter = fp8_weight.shape[0] // 2
    block_m, block_n, block_k, stages, warps = tiles(rows)
    parts = triton.cdiv(inter, block_n)
    y = torch.empty(rows, inter, dtype=dtype, device=x8.device)
    amax = torch.empty(rows, parts, dtype=torch.float32, device=x8.device)
    _gate_up_silu_kernel[(parts, triton.cdiv(rows, block_m))](
        x8, fp8_weight, fp8_scale, x_scale, y, amax, rows, inter, k, x8.stride(0),
        fp8_weight.stride(0), y.stride(0), amax.stride(0), EVEN_K=k % block_k == 0,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    q = torch.empty(rows, inter, dtype=FP8_DTYPE, device=x8.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x8.device)
    _round_by_parts_kernel[(rows, triton.cdiv(inter, ROUND_CHUNK))](
        y, amax, q.view(torch.uint8), scale, inter, parts, y.stride(0), amax.stride(0),
        q.stride(0), PARTS=triton.next_power_of_2(parts), CHUNK=ROUND_CHUNK,
        HW_E4M3=triton_rounded_rows.hw_e4m3(x8) if hw is None else hw, num_warps=4,
    )  # fmt: skip
    return y, q, scale


def serves(x8: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether the MLP's gate/up and activation at x8's rows may go to the op: decode's rows of
    our FP8-MMA GEMM (1 to MAX_ROWS, on CUDA), a scale a row, no bias, a [gate | up] weight of
    two equal halves. Shapes and dtypes only (it runs inside the compiled forward); the op
    itself takes its twin where the GPU lacks the FP8 MMA."""
    k = x8.shape[-1]
    rows = x8.numel() // k if k else 0
    return (
        x8.is_cuda
        and 0 < rows <= MAX_ROWS
        and x_scale.shape == x8.shape[:-1]
        and bias is None
        and weight.dtype in (torch.bfloat16, torch.float16)
        and weight.shape[0] % 2 == 0
    )


@torch.library.custom_op("rollout::gate_up_silu_rounded", mutates_args=())
def gate_up_silu_rounded(
    x8: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    fp8_weight: torch.Tensor,
    fp8_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): silu(gate) * up rounded with a scale a row, for [gate | up] = the W8A8 GEMM of
    x8 (x_scale a row) and weight == fp8_weight * fp8_scale; by the two launches above where the
    GPU has the FP8 MMA and `serves` holds, else `rollout::w8a8_linear` then
    `rollout::silu_mul_rounded`, the unfused ops."""
    if not (
        serves(x8, x_scale, weight, None)
        and has_e4m3_instructions(x8.device)
        and fp8_weight.stride(-1) == 1
        and fp8_scale.is_contiguous()
    ):
        gate_up = torch.ops.rollout.w8a8_linear(x8, x_scale, weight, None, fp8_weight, fp8_scale)
        _, q, scale = torch.ops.rollout.silu_mul_rounded(gate_up, False, False)
        return q, scale
    lead, k = x8.shape[:-1], x8.shape[-1]
    _, q, scale = launch(
        x8.reshape(-1, k).contiguous(),
        x_scale.reshape(-1).float().contiguous(),
        fp8_weight,
        fp8_scale,
        weight.dtype,
    )
    return q.view(*lead, q.shape[-1]), scale.view(lead)


@gate_up_silu_rounded.register_fake
def _(x8, x_scale, weight, fp8_weight, fp8_scale):
    inter = weight.shape[0] // 2
    return x8.new_empty(*x8.shape[:-1], inter), x8.new_empty(x8.shape[:-1], dtype=torch.float32)
