"""A decoder layer's RMSNorm with its output rounded to e4m3, in one pass over each row: what
the q/k/v and gate/up projections read under FP8 activations (EngineConfig.activation_quantization).

torch.compile makes the rounding's amax a second reduction over the norm's row: with a scale per
row its kernel walks each row three times, with one per 128 inputs it splits into two or three
kernels (docs/performance.md, 'W8A8 with a scale per 128 inputs'). Here one program holds a whole
row in registers: the residual add, the sum of squares, the norm and weight with transformers'
roundings (`torch_rounded_norm`, the twin), the amax of each row or 128-input group, and the
rounded row written twice: in the activations' dtype (exact: what the FP8-weight GEMM and F.linear
read) and as e4m3 bytes with their scales (what the FP8 MMA GEMM reads).

Runs as the custom ops `rollout::rms_norm_rounded` and `rollout::add_rms_norm_rounded` (opaque to
torch.compile); off CUDA, under Triton's interpreter or for a weight whose dtype differs from the
activations', they compute the twin.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from rollout.kernels import torch_rounded_norm
from rollout.kernels.torch_fp8 import ACTIVATION_GROUP, FP8_DTYPE
from rollout.kernels.triton_attention_tiles import e4m3_bits, pow2_scale

MAX_ROW = 16384
"""The widest row one program holds (hidden sizes above take the twin)."""


@triton.jit
def _rms_norm_rounded_kernel(
    x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, q_ptr, s_ptr, n, eps,
    stride_x, stride_r, stride_h, stride_y, stride_q, stride_s,
    HAS_RESIDUAL: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:  # residual + x in the activations' dtype, as the layer adds them
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
        tl.store(h_ptr + row * stride_h + offs, x, mask=mask)
    h = x.to(tl.float32)
    variance = tl.sum(h * h, 0) / n
    normed = (h * tl.math.rsqrt(variance + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(x.dtype).to(tl.float32)
    # Each row, or each GROUP of it, to e4m3 with its power-of-two scale (torch_fp8's rule).
    groups: tl.constexpr = BLOCK // GROUP
    tiles = tl.reshape(y, [groups, GROUP])
    scale, inverse = pow2_scale(tl.max(tl.abs(tiles), 1))
    scaled = tiles * inverse[:, None]  # exact: a power of two
    code = tl.reshape(e4m3_bits(tl.minimum(tl.maximum(scaled, -448.0), 448.0)), [BLOCK])
    value = tl.reshape(code.to(tl.float8e4nv, bitcast=True).to(tl.float32), [groups, GROUP])
    rounded = tl.reshape(value * scale[:, None], [BLOCK])
    tl.store(y_ptr + row * stride_y + offs, rounded.to(x.dtype), mask=mask)
    tl.store(q_ptr + row * stride_q + offs, code, mask=mask)
    g = tl.arange(0, groups)
    tl.store(s_ptr + row * stride_s + g, scale, mask=g * GROUP < n)


def _kernel_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.is_cuda
        and torch.version.hip is None
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        and weight.dtype == x.dtype
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and x.shape[-1] <= MAX_ROW
    )


def launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    grouped: bool,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel over x [rows, n] (and residual [rows, n]): (h or None, y, q, scale), scale
    [rows, ceil(n / 128)] with `grouped`, else [rows]. Tests launch it under the interpreter."""
    rows, n = x.shape
    block = triton.next_power_of_2(n)
    group = min(ACTIVATION_GROUP, block) if grouped else block
    y = torch.empty_like(x)
    q = torch.empty(rows, n, dtype=FP8_DTYPE, device=x.device)
    groups = triton.cdiv(n, ACTIVATION_GROUP) if grouped else 1
    scale = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    h = torch.empty_like(x) if residual is not None else None
    _rms_norm_rounded_kernel[(rows,)](
        x, residual if residual is not None else x, weight, h if h is not None else y, y,
        q.view(torch.uint8), scale, n, eps,
        x.stride(0), residual.stride(0) if residual is not None else 0,
        h.stride(0) if h is not None else 0, y.stride(0), q.stride(0), scale.stride(0),
        HAS_RESIDUAL=residual is not None, GROUP=group, BLOCK=block,
        num_warps=8 if block >= 4096 else 4,
    )  # fmt: skip
    return h, y, q, scale if grouped else scale.view(rows)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def _shaped(like: torch.Tensor, y, q, scale, grouped: bool):
    lead = like.shape[:-1]
    return (
        y.view(like.shape),
        q.view(like.shape),
        scale.view(*lead, -1) if grouped else scale.view(lead),
    )


@torch.library.custom_op("rollout::rms_norm_rounded", mutates_args=())
def rms_norm_rounded(
    x: torch.Tensor, weight: torch.Tensor, eps: float, grouped: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, q, scale): RMSNorm(x) * weight rounded as FP8 activations round a projection's input
    (`torch_rounded_norm.rms_norm_rounded` without a residual)."""
    if not _kernel_serves(x, weight):
        return torch_rounded_norm.rms_norm_rounded(x, weight, eps, grouped)[1:]
    _, y, q, scale = launch(_rows(x), weight, eps, grouped)
    return _shaped(x, y, q, scale, grouped)


@torch.library.custom_op("rollout::add_rms_norm_rounded", mutates_args=())
def add_rms_norm_rounded(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, grouped: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, q, scale): h = residual + x, then `rms_norm_rounded` of h."""
    if not _kernel_serves(x, weight):
        return torch_rounded_norm.rms_norm_rounded(x, weight, eps, grouped, residual)
    h, y, q, scale = launch(_rows(x), weight, eps, grouped, _rows(residual))
    return (h.view(x.shape), *_shaped(x, y, q, scale, grouped))


def _fake_outputs(x: torch.Tensor, weight: torch.Tensor, grouped: bool):
    lead = x.shape[:-1]
    dtype = torch.promote_types(x.dtype, weight.dtype)
    groups = (*lead, triton.cdiv(x.shape[-1], ACTIVATION_GROUP)) if grouped else lead
    return (
        x.new_empty(x.shape, dtype=dtype),
        x.new_empty(x.shape, dtype=FP8_DTYPE),
        x.new_empty(groups, dtype=torch.float32),
    )


@rms_norm_rounded.register_fake
def _(x, weight, eps, grouped):
    return _fake_outputs(x, weight, grouped)


@add_rms_norm_rounded.register_fake
def _(x, residual, weight, eps, grouped):
    return (x.new_empty(x.shape), *_fake_outputs(x, weight, grouped))
