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

In an engine step the same launch also writes the layer's keys (normed and rotated) and values
into the paged cache (`norm_rope_writing_kv`, a program per value head more): the bytes and
scales `write_kv` would store from the op's output, in one launch a layer fewer. The engine's op
that asks for it is fused_qk_rope.py's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rollout.kernels import torch_qk_rope
from rollout.kernels.gpu_features import compiled_on_nvidia
from rollout.kernels.triton_attention_tiles import e4m3_bits, kv_scale_args, pow2_scale
from rollout.kernels.triton_import import tl, triton
from rollout.kernels.triton_paged_attention import slot_row

MAX_HEAD_DIM = 512
"""The widest head one program holds (wider heads take the twin)."""


class KVWrite(NamedTuple):
    """Where a layer's keys and values go: its paged cache, each token's slot (< 0: a padded
    token, not written) and, for an FP8 cache, its scales (`write_kv`'s arguments)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, out_ptr, tokens, eps,
    stride_x, stride_cos, stride_sin, stride_out,
    slot_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
    stride_kblock, stride_kslot, stride_khead, stride_kdim,
    stride_vblock, stride_vslot, stride_vhead, stride_vdim,
    stride_sblock, stride_sslot, stride_shead,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr, WRITE_KV: tl.constexpr, FP8_KV: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(1)  # q heads, k heads, then (WRITE_KV) v heads: qkv's own order
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < HALF
    row_ok = rows < tokens
    mask = row_ok[:, None] & col_ok[None, :]
    rows = rows.to(tl.int64)
    x_row = x_ptr + rows[:, None] * stride_x + head * (2 * HALF) + cols[None, :]
    x1 = tl.load(x_row, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    if WRITE_KV:
        if head >= NUM_Q + NUM_KV:  # a value head: into the cache as it is
            _write_rows(
                x1, x2, rows, row_ok, cols, col_ok, head - NUM_Q - NUM_KV, slot_ptr,
                v_cache_ptr, v_scale_ptr, stride_vblock, stride_vslot, stride_vhead,
                stride_vdim, stride_sblock, stride_sslot, stride_shead, HALF, FP8_KV, PAGE,
            )  # fmt: skip
            return
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
    o1 = ((y1 * c1).to(dtype).to(tl.float32) - (y2 * s1).to(dtype).to(tl.float32)).to(dtype)
    o2 = ((y2 * c2).to(dtype).to(tl.float32) + (y1 * s2).to(dtype).to(tl.float32)).to(dtype)
    out_row = out_ptr + rows[:, None] * stride_out + head * (2 * HALF) + cols[None, :]
    tl.store(out_row, o1, mask=mask)
    tl.store(out_row + HALF, o2, mask=mask)
    if WRITE_KV:
        if head >= NUM_Q:  # a key head: its normed, rotated row into the cache too
            _write_rows(
                o1, o2, rows, row_ok, cols, col_ok, head - NUM_Q, slot_ptr, k_cache_ptr,
                k_scale_ptr, stride_kblock, stride_kslot, stride_khead, stride_kdim,
                stride_sblock, stride_sslot, stride_shead, HALF, FP8_KV, PAGE,
            )  # fmt: skip


@triton.jit
def _write_rows(
    x1, x2, rows, row_ok, cols, col_ok, kv_head, slot_ptr, cache_ptr, scale_ptr,
    stride_block, stride_slot, stride_head, stride_dim, stride_sblock, stride_sslot, stride_shead,
    HALF: tl.constexpr, FP8_KV: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    """A KV head's rows, given as their two halves in the activations' dtype, into their slots
    (none for a padded token's, < 0): the very bytes and scales of `write_kv`'s kernel."""
    slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1)
    ok = row_ok & (slot >= 0)
    mask = ok[:, None] & col_ok[None, :]
    start = slot_row(slot, kv_head, PAGE, stride_block, stride_slot, stride_head)[:, None]
    dst = cache_ptr + start + cols[None, :] * stride_dim
    if FP8_KV:  # each row in e4m3 with its power-of-two scale, as torch_fp8.quantize_kv
        h1 = x1.to(tl.float32)
        h2 = x2.to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(h1), 1), tl.max(tl.abs(h2), 1))
        scale, inverse = pow2_scale(amax)
        s_dst = slot_row(slot, kv_head, PAGE, stride_sblock, stride_sslot, stride_shead)
        tl.store(scale_ptr + s_dst, scale, mask=ok)
        tl.store(dst, e4m3_bits(h1 * inverse[:, None]), mask=mask)  # the cache as bytes
        tl.store(dst + HALF * stride_dim, e4m3_bits(h2 * inverse[:, None]), mask=mask)
    else:
        tl.store(dst, x1.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF * stride_dim, x2.to(cache_ptr.dtype.element_ty), mask=mask)


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
    kv: KVWrite | None = None,
) -> torch.Tensor:
    """The kernel over qkv [tokens, width] with cos/sin [tokens, head_dim] (rows of unit
    stride): [tokens, num_q_heads + num_kv_heads, head_dim]; with `kv`, each token's normed,
    rotated keys and its values also written into their slots, as `write_kv` would. Tests
    launch it under Triton's interpreter."""
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    heads = num_q_heads + num_kv_heads
    out = torch.empty(tokens, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    half = head_dim // 2
    block_t = tokens_per_program(tokens)
    if kv is None:
        cache_args = (out,) * 5 + (0,) * 11
    else:
        k_cache, v_cache = kv.k_cache, kv.v_cache
        if kv.fp8:  # the kernel writes the e4m3 bytes itself (e4m3_bits)
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        scales = (kv.k_scale, kv.v_scale) if kv.fp8 else None
        k_scale, v_scale, *scale_strides = kv_scale_args(k_cache, scales)
        cache_args = (
            kv.slot_mapping, k_cache, v_cache, k_scale, v_scale,
            *k_cache.stride(), *v_cache.stride(), *scale_strides,
        )  # fmt: skip
    grid = (triton.cdiv(tokens, block_t), heads + (num_kv_heads if kv is not None else 0))
    _qk_norm_rope_kernel[grid](
        qkv, q_weight, k_weight, cos, sin, out, tokens, eps,
        qkv.stride(0), cos.stride(0), sin.stride(0), out.stride(0), *cache_args,
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=half, BLOCK_H=triton.next_power_of_2(half),
        BLOCK_T=block_t, WRITE_KV=kv is not None, FP8_KV=kv is not None and kv.fp8,
        PAGE=kv.k_cache.shape[1] if kv is not None else 1,
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


def norm_rope_writing_kv(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    kv: KVWrite,
) -> torch.Tensor | None:
    """`qk_norm_rope`'s result, with the normed, rotated keys and the values (qkv's last
    num_kv_heads heads) written into `kv` in the same launch: one launch a layer fewer than the
    op and `write_kv`. None where the kernel does not serve these tensors (nothing written)."""
    head_dim = q_weight.shape[0]
    tokens = qkv.numel() // max(qkv.shape[-1], 1)
    if not (
        _kernel_serves(qkv, q_weight, k_weight, cos, sin)
        and cos.shape[:-1] == qkv.shape[:-1]
        and qkv.shape[-1] == (num_q_heads + 2 * num_kv_heads) * head_dim
        and kv.slot_mapping.shape == (tokens,)
        and kv.k_cache.shape[2:] == kv.v_cache.shape[2:] == (num_kv_heads, head_dim)
        and kv.k_cache.shape[:2] == kv.v_cache.shape[:2]
        and all(t.device == qkv.device for t in kv if t is not None)
    ):
        return None
    out = launch(
        _rows(qkv), q_weight, k_weight, eps, _rows(cos), _rows(sin), num_q_heads, num_kv_heads,
        kv,
    )  # fmt: skip
    return out.view(*qkv.shape[:-1], num_q_heads + num_kv_heads, head_dim)


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
