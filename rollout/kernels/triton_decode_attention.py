"""Split-KV paged decode attention in Triton, merged in the same launch.

One query token per sequence. Each context is split into fixed-length pieces processed by
separate programs, all query heads of one KV head together (each K/V byte is read once); the
last piece of a (sequence, KV head) to finish merges the pieces by their log-sum-exp, in the
same launch. The grid depends only on the batch size and the static maximum context, so the
launch can sit inside a CUDA graph. The PyTorch twin is torch_paged_attention.paged_attention.

With a sliding window the splits start at the window's first split, so a windowed layer runs
only the programs its window can reach and reads no context outside the window. Softcap and
sinks are compile-time switches: a layer without them runs the same code as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rollout.kernels.triton_attention_tiles import (
    add_sinks,
    dot_precision,
    fold_tile,
    load_kv_tile,
    soft_cap,
)


@dataclass(frozen=True)
class DecodeTiles:
    """Launch shape of the decode kernel. Fewer, longer splits and wider KV tiles won
    `bench_attention.py --sweep` both at w1's mean context and at 64 x 4096 (see
    docs/performance.md, 'Decode attention alone')."""

    split_len: int = 512  # tokens of context per decode program
    block_n: int = 128  # tokens per inner iteration
    num_warps: int = 4
    num_stages: int = 3


DECODE_TILES = DecodeTiles()


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, sinks_ptr,
    part_out_ptr, part_lse_ptr, arrivals_ptr, out_ptr,
    scale, window, softcap, stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cblock, stride_cslot, stride_chead, stride_bt,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_LEN: tl.constexpr, NUM_SPLITS: tl.constexpr,
    MERGE_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + s)
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    out_ptrs = out_ptr + s * stride_ot + heads[:, None] * stride_oh + d[None, :]
    out_mask = head_mask[:, None] & d_mask[None, :]
    if seq_len == 0:  # CUDA-graph padding: zeros, so no garbage flows into the padded row
        if split == 0:
            tl.store(out_ptrs, tl.zeros([GROUP_PAD, BLOCK_D], out_ptr.dtype.element_ty), out_mask)
        return
    lo = seq_len * 0  # first visible position
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    first_split = lo // SPLIT_LEN  # programs count their split from the window's first one
    start = (first_split + split) * SPLIT_LEN
    if start >= seq_len:
        return
    end = tl.minimum(start + SPLIT_LEN, seq_len)
    q = tl.load(
        q_ptr + s * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=out_mask,
        other=0.0,
    )  # [GROUP_PAD, BLOCK_D]
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for n0 in range(tl.maximum(start, lo), end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < end
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, block_tables_ptr + s * stride_bt, offs, n_mask, d, d_mask,
            kv_head, stride_cblock, stride_cslot, stride_chead, PAGE,
        )  # fmt: skip
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [GROUP_PAD, BLOCK_N]
        if HAS_SOFTCAP:
            qk = soft_cap(qk, softcap)
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m, denom, acc = fold_tile(qk, v, m, denom, acc, DOT_PRECISION)
    num_active = tl.cdiv(seq_len, SPLIT_LEN) - first_split
    if num_active == 1:  # the whole visible context fit one split: no partials, no merge
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=head_mask, other=0.0).to(tl.float32)
            m, denom, acc = add_sinks(m, denom, acc, sink)
        tl.store(out_ptrs, (acc / denom[:, None]).to(out_ptr.dtype.element_ty), out_mask)
        return

    # Several splits: publish this one's partial result, and let whichever split of this
    # (sequence, KV head) arrives last merge them all by log-sum-exp. That saves a second kernel
    # launch per layer. The barrier makes every thread's partial stores precede the release.
    part_ptrs = (
        part_out_ptr + ((s * NUM_HEADS + heads[:, None]) * NUM_SPLITS) * HEAD_DIM + d[None, :]
    )
    lse_ptrs = part_lse_ptr + (s * NUM_HEADS + heads) * NUM_SPLITS
    tl.store(part_ptrs + split * HEAD_DIM, acc / denom[:, None], mask=out_mask)
    tl.store(lse_ptrs + split, m + tl.log(denom), mask=head_mask)
    tl.debug_barrier()
    arrivals = arrivals_ptr + s * NUM_KV_HEADS + kv_head
    arrived_before = tl.atomic_add(arrivals, 1, sem="acq_rel")
    if arrived_before == num_active - 1:
        tl.store(arrivals, 0)  # reset for the next launch (the next layer or step)
        # One head at a time, MERGE_CHUNK splits per load (a few L2 round trips, not one per
        # split: this runs on the kernel's critical path). .cg reads through L2, where the
        # other programs' stores landed (L1 is not coherent across SMs).
        c = tl.arange(0, MERGE_CHUNK)
        for gi in tl.static_range(GROUP):
            base = (s * NUM_HEADS + kv_head * GROUP + gi) * NUM_SPLITS
            m_all = tl.full([1], float("-inf"), tl.float32)
            weight = tl.zeros([1], tl.float32)
            if HAS_SINKS:  # the sink joins the merge as a part with a weight and no value
                m_all = tl.load(sinks_ptr + kv_head * GROUP + gi + tl.zeros([1], tl.int32))
                m_all = m_all.to(tl.float32)
                weight = tl.full([1], 1.0, tl.float32)
            merged = tl.zeros([BLOCK_D], tl.float32)
            for c0 in range(0, num_active, MERGE_CHUNK):
                chunk_mask = c0 + c < num_active
                lse = tl.load(
                    part_lse_ptr + base + c0 + c, mask=chunk_mask, other=float("-inf"),
                    cache_modifier=".cg",
                )  # fmt: skip
                parts = tl.load(
                    part_out_ptr + (base + c0 + c[:, None]) * HEAD_DIM + d[None, :],
                    mask=chunk_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg",
                )  # fmt: skip
                m_new = tl.maximum(m_all, tl.max(lse, 0))
                alpha = tl.exp(m_all - m_new)
                w = tl.exp(lse - m_new)
                merged = merged * alpha + tl.sum(parts * w[:, None], 0)
                weight = weight * alpha + tl.sum(w, 0)
                m_all = m_new
            head_out = out_ptr + s * stride_ot + (kv_head * GROUP + gi) * stride_oh + d
            tl.store(head_out, (merged / weight).to(out_ptr.dtype.element_ty), mask=d_mask)


class _ArrivalCounters:
    """Zeroed int32 counters, one per (sequence, KV head), that the decode kernel leaves zeroed.

    One buffer per CUDA stream: launches on one stream are ordered, so they may share counters,
    while two engines stepping on their own streams must not. Buffers live as long as the process:
    a captured CUDA graph holds the address it was captured with, so an outgrown buffer must
    never be freed and its memory reused.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, list[torch.Tensor]] = {}

    def get(self, device: torch.device, count: int) -> torch.Tensor:
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        buffers = self._buffers.setdefault((device, stream), [])
        if not buffers or buffers[-1].numel() < count:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "decode attention needs new arrival counters during CUDA-graph capture; "
                    "run the step once eagerly on the capture stream first (the graph runner's "
                    "warm-up does)"
                )
            buffers.append(torch.zeros(max(count, 4096), dtype=torch.int32, device=device))
        return buffers[-1]


_ARRIVALS = _ArrivalCounters()


def decode_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    scale,
    max_seq_len_static,
    tiles=DECODE_TILES,
    window=None,
    softcap=None,
    sinks=None,
):
    """query [num_seqs, num_heads, head_dim] (one token per sequence) -> same shape."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_splits = triton.cdiv(max_seq_len_static, tiles.split_len)
    if window is not None:  # a window of W positions spans at most cdiv(W, split) + 1 splits
        num_splits = min(num_splits, triton.cdiv(window, tiles.split_len) + 1)
    part_out = torch.empty(
        num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
    )
    part_lse = torch.empty(
        num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device
    )
    arrivals = _ARRIVALS.get(query.device, num_seqs * num_kv_heads)
    out = torch.empty_like(query)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, sinks if sinks is not None else query,
        part_out, part_lse, arrivals, out,
        scale, window or 0, softcap or 0.0, query.stride(0), query.stride(1), out.stride(0),
        out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1],
        BLOCK_N=tiles.block_n, SPLIT_LEN=tiles.split_len, NUM_SPLITS=num_splits,
        MERGE_CHUNK=min(16, triton.next_power_of_2(num_splits)),
        DOT_PRECISION=dot_precision(query), HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out
