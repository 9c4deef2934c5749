"""Paged attention in Triton: KV write, decode, prefill/extend; the attention backend's surface.

Same signatures and semantics as the PyTorch twins in torch_paged_attention.py (the oracle):
cache [num_blocks, block_size, num_kv_heads, head_dim]; sequence s owns query rows
[query_start_loc[s], query_start_loc[s+1]) which are the last tokens of its seq_lens[s] context.
Decode (one query per sequence, split-KV, merged in the same launch) lives in
triton_decode_attention.py and is re-exported here.
"""

from __future__ import annotations

import torch

from rollout.kernels.tiling import EXTEND_BLOCK_M, page_run
from rollout.kernels.triton_attention_tiles import (
    add_sinks,
    dot_precision,
    e4m3_bits,
    fold_tile,
    fp16_keys,
    kv_scale_args,
    load_kv_tile,
    pow2_scale,
    query_for_tiles,
    reads_v_by_token,
    scale_scores,
    soft_cap,
)
from rollout.kernels.triton_decode_attention import (  # noqa: F401 - the backend's surface
    DECODE_TILES,
    DecodeTiles,
    decode_attention,
)
from rollout.kernels.triton_fp8_widen import fast_widen
from rollout.kernels.triton_import import tl, triton

EXTEND_BLOCK_N = 64


@triton.jit
def slot_row(slot, head, PAGE: tl.constexpr, stride_block, stride_slot, stride_head):
    """Where (slot, head)'s row starts in a paged cache or its scales, by that tensor's strides
    (each layout the engine holds: K head by head, V by token, the scales head by head)."""
    return (slot // PAGE) * stride_block + (slot % PAGE) * stride_slot + head * stride_head


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cblock, stride_cslot, stride_chead,
    stride_sblock, stride_sslot, stride_shead,
    stride_vblock, stride_vslot, stride_vhead, stride_vdim,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, FP8_KV: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        d = tl.arange(0, BLOCK_D)
        mask = d < HEAD_DIM
        k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask, other=0.0)
        v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask, other=0.0)
        # K by its strides: an FP8 cache's is laid out head by head (`keys_by_head`)
        dst = slot_row(slot, h, PAGE, stride_cblock, stride_cslot, stride_chead) + d
        # V by its own strides: an FP8 cache's is laid out by token (`v_by_token`)
        v_dst = slot_row(slot, h, PAGE, stride_vblock, stride_vslot, stride_vhead)
        v_dst += d * stride_vdim
        if FP8_KV:  # each row in e4m3 with its power-of-two scale, as torch_fp8.quantize_kv
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            k_scale, k_inverse = pow2_scale(tl.max(tl.abs(k), 0))
            v_scale, v_inverse = pow2_scale(tl.max(tl.abs(v), 0))
            # by their own strides too: the engine's are laid out head by head (`scales_by_head`)
            s_dst = slot_row(slot, h, PAGE, stride_sblock, stride_sslot, stride_shead)
            tl.store(k_scale_ptr + s_dst, k_scale)
            tl.store(v_scale_ptr + s_dst, v_scale)
            tl.store(k_cache_ptr + dst, e4m3_bits(k * k_inverse), mask=mask)  # the cache as bytes
            tl.store(v_cache_ptr + v_dst, e4m3_bits(v * v_inverse), mask=mask)
        else:
            tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    fp8 = k_scale is not None
    if fp8:  # the kernel writes the e4m3 bytes itself (e4m3_bits)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    _write_kv_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, slot_mapping,
        k_scale if fp8 else k_cache, v_scale if fp8 else v_cache,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        *kv_scale_args(k_cache, (k_scale, v_scale) if fp8 else None)[2:], *v_cache.stride(),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), FP8_KV=fp8,
        PAGE=k_cache.shape[1],
    )  # fmt: skip


@triton.jit
def _extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    q_block_seq_ptr, q_block_start_ptr, sinks_ptr, scale, window, softcap,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cblock, stride_cslot, stride_chead, stride_bt,
    k_scale_ptr, v_scale_ptr, stride_sblock, stride_sslot, stride_shead,
    FP8_KV: tl.constexpr, FAST_WIDEN: tl.constexpr, K_F16: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    PAGE_RUN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    V_BY_TOKEN: tl.constexpr,
):  # fmt: skip
    qb = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // GROUP
    s = tl.load(q_block_seq_ptr + qb)
    if s < 0:  # padding entry
        return
    m0 = tl.load(q_block_start_ptr + qb)
    q_start = tl.load(query_start_loc_ptr + s)
    q_len = tl.load(query_start_loc_ptr + s + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + s)
    prefix = seq_len - q_len
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_mask = offs_m < q_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q, q_back = query_for_tiles(q, K_F16)
    q_pos = prefix + offs_m
    kv_end = tl.minimum(seq_len, prefix + m0 + BLOCK_M)  # causal: nothing past the block's last row
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    kv_start = prefix * 0
    if HAS_WINDOW:  # nothing before the window of the block's first row
        kv_start = tl.maximum(prefix + m0 - window + 1, 0)
        if V_BY_TOKEN:  # tiles from a page run's start (load_kv_tile); the window masks the rest
            kv_start = kv_start // PAGE_RUN * PAGE_RUN
    for n0 in range(kv_start, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        k, v, k_scale, v_scale = load_kv_tile(
            k_cache_ptr, v_cache_ptr, block_tables_ptr + s * stride_bt, n0, offs_n, n_mask, d,
            d_mask, kv_head, stride_cblock, stride_cslot, stride_chead, PAGE, PAGE_RUN,
            k_scale_ptr, v_scale_ptr, stride_sblock, stride_sslot, stride_shead, q_ptr, FP8_KV,
            FAST_WIDEN, K_F16, V_BY_TOKEN, HEAD_DIM,
        )  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
        qk = scale_scores(qk, k_scale, q_back, FP8_KV, K_F16)
        if HAS_SOFTCAP:
            qk = soft_cap(qk, softcap)
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        if HAS_WINDOW:
            visible &= offs_n[None, :] > q_pos[:, None] - window
        qk = tl.where(visible, qk, float("-inf"))
        m, denom, acc = fold_tile(qk, v, v_scale, m, denom, acc, DOT_PRECISION, FP8_KV)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h + offs_m * 0).to(tl.float32)  # [BLOCK_M], one head's
        m, denom, acc = add_sinks(m, denom, acc, sink)
    out = acc / denom[:, None]
    tl.store(
        out_ptr + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def extend_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    query_start_loc,
    seq_lens,
    q_block_seq,
    q_block_start,
    scale,
    window=None,
    softcap=None,
    sinks=None,
    kv_scales=None,
):
    """Packed queries of several sequences (any chunk start, decode rows too) -> same shape.
    `kv_scales`: an FP8 cache's (k_scale, v_scale)."""
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    k_f16 = fp16_keys(query, kv_scales is not None)
    by_token = reads_v_by_token(k_cache, v_cache, kv_scales is not None)
    run = page_run(k_cache.shape[1], EXTEND_BLOCK_N, by_token, "extend_attention")
    _extend_kernel[(q_block_seq.shape[0], num_heads)](
        query, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens,
        q_block_seq, q_block_start, sinks if sinks is not None else query, scale, window or 0,
        softcap or 0.0, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *kv_scale_args(k_cache, kv_scales), FP8_KV=kv_scales is not None,
        FAST_WIDEN=kv_scales is not None and fast_widen(query.dtype, query.device),
        K_F16=k_f16,
        GROUP=num_heads // k_cache.shape[2], HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1],
        PAGE_RUN=run, BLOCK_M=EXTEND_BLOCK_M, BLOCK_N=EXTEND_BLOCK_N,
        DOT_PRECISION=dot_precision(query),
        HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None,
        V_BY_TOKEN=by_token, num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
