"""A Qwen3-family attention's q/k RMSNorm and rotary embedding in one launch.

Between the fused q/k/v GEMM and the attention, Qwen3 normalizes every query and key head over
its head_dim, then rotates it. torch.compile makes these two autotuned kernels a layer, and
their time per launch was bimodal from run to run (docs/performance.md, 'FP8's small kernels').
This launch has fixed tiles: one program per (token tile, head), each head's two halves in
registers, the norm with transformers' roundings, then the rotation, written as
[tokens, q heads + kv heads, head_dim] (the attention reads q and k as views of it).

The roundings are the eager module's (`torch_qk_rope`, the twin): the normed row cast to the
activations' dtype, its product with the weight cast, each of q * cos and rotate_half(q) * sin
cast, then their sum. fp-fusion is off, so fp32 sums products as torch does, without FMA.

Run as the custom op `rollout::qk_norm_rope`, opaque to torch.compile; off CUDA, under Triton's
interpreter, or where the weights, cos and sin do not share the activations' dtype, it computes
the twin.
"""

from __future__ import annotations

import torch

from rollout.kernels import torch_qk_rope
from rollout.kernels.gpu_features import compiled_on_nvidia
from rollout.kernels.triton_import import tl, triton

MAX_HEAD_DIM = 512
"""The widest head one program holds (wider heads take the twin)."""


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, out_ptr, tokens, eps,
    stride_x, stride_cos, stride_sin, stride_out,
    NUM_Q: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < HALF
    mask = (rows < tokens)[:, None] & col_ok[None, :]
    rows = rows.to(tl.int64)
    x_row = x_ptr + rows[:, None] * stride_x + head * (2 * HALF) + cols[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    if head < NUM_Q:
        w_ptr = qw_ptr
    else:
        w_ptr = kw_ptr
    w1 = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    h1 = x1.to(tl.float32)
    h2 = x2.to(tl.float32)
    variance = (tl.sum(h1 * h1, 1) + tl.sum(h2 * h2, 1)) / (2 * HALF)
    inverse = tl.math.rsqrt(variance + eps)[:, None]
    y1 = (w1 * (h1 * inverse).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    y2 = (w2 * (h2 * inverse).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    cos_row = cos_ptr + rows[:, None] * stride_cos + cols[None, :]
    sin_row = sin_ptr + rows[:, None] * stride_sin + cols[None, :]
    c1 = tl.load(cos_row, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_row + HALF, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_row + HALF, mask=mask, other=0.0).to(tl.float32)
    # rotate_half(y) = [-y2, y1]
    o1 = (y1 * c1).to(dtype).to(tl.float32) - (y2 * s1).to(dtype).to(tl.float32)
    o2 = (y2 * c2).to(dtype).to(tl.float32) + (y1 * s2).to(dtype).to(tl.float32)
    out_row = out_ptr + rows[:, None] * stride_out + head * (2 * HALF) + cols[None, :]
    tl.store(out_row, o1.to(dtype), mask=mask)
    tl.store(out_row + HALF, o2.to(dtype), mask=mask)


def tokens_per_program(tokens: int) -> int:
    """One token a program at decode's few rows (the most programs); eight from 257 rows, where
    prefill's thousands of tokens would otherwise launch a program per (token, head)."""
    return 1 if tokens <= 256 else 8


def launch(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """The kernel over qkv [tokens, width] with cos/sin [tokens, head_dim] (rows of unit
    stride): [tokens, num_q_heads + num_kv_heads, head_dim]. Tests launch it under Triton's
    interpreter."""
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    heads = num_q_heads + num_kv_heads
    out = torch.empty(tokens, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    half = head_dim // 2
    block_t = tokens_per_program(tokens)
    _qk_norm_rope_kernel[(triton.cdiv(tokens, block_t), heads)](
        qkv, q_weight, k_weight, cos, sin, out, tokens, eps,
        qkv.stride(0), cos.stride(0), sin.stride(0), out.stride(0),
        NUM_Q=num_q_heads, HALF=half, BLOCK_H=triton.next_power_of_2(half), BLOCK_T=block_t,
        num_warps=1 if block_t == 1 else 4, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def _kernel_serves(qkv, q_weight, k_weight, cos, sin) -> bool:
    head_dim = q_weight.shape[0]
    return (
        compiled_on_nvidia(qkv.device)
        and qkv.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and all(t.dtype == qkv.dtype for t in (q_weight, k_weight, cos, sin))
        and k_weight.shape == q_weight.shape
        and head_dim % 2 == 0
        and head_dim <= MAX_HEAD_DIM
        and cos.shape[-1] == head_dim
        and sin.shape[-1] == head_dim
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("rollout::qk_norm_rope", mutates_args=())
def qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """[..., tokens, num_q_heads + num_kv_heads, head_dim]: the query heads of qkv [..., tokens,
    width] normed by q_weight and rotated, then its key heads normed by k_weight and rotated
    (cos/sin [..., tokens, head_dim]); `torch_qk_rope.qk_norm_rope`."""
    if not _kernel_serves(qkv, q_weight, k_weight, cos, sin) or cos.shape[:-1] != qkv.shape[:-1]:
        return torch_qk_rope.qk_norm_rope(
            qkv, q_weight, k_weight, eps, cos, sin, num_q_heads, num_kv_heads
        )
    out = launch(
        _rows(qkv), q_weight, k_weight, eps, _rows(cos), _rows(sin), num_q_heads, num_kv_heads
    )
    return out.view(*qkv.shape[:-1], num_q_heads + num_kv_heads, q_weight.shape[0])


@qk_norm_rope.register_fake
def _(qkv, q_weight, k_weight, eps, cos, sin, num_q_heads, num_kv_heads):
    return qkv.new_empty(*qkv.shape[:-1], num_q_heads + num_kv_heads, q_weight.shape[0])
