"""Split-KV paged decode attention in Triton, merged in the same launch.

One query token per sequence, or the same few for every sequence (a speculative verification
step laid out for its CUDA graph: K drafts + 1, the last positions of each context, causal among
themselves). Each context is split into pieces processed by separate programs, all query rows
of one KV head together (every query token times every head of its group: each K/V byte is read
once); the last piece of a (sequence, KV head) to finish merges the pieces by their log-sum-exp,
in the same launch. The PyTorch twin is torch_paged_attention.paged_attention.

How long a piece is depends on the batch: a launch aims at `DecodeTiles.target_programs`
programs, so a step with a handful of sequences cuts each context into many short pieces (a
single sequence's 1K-token context would otherwise be read by 16 programs, each walking 512
tokens one tile after another, while the rest of the GPU idles), and a large batch keeps pieces
of `split_len` tokens, or of up to `full_batch_split_len` once its sequences alone fill the
target (then fewer, longer pieces cost less merging than they lose in parallelism). Each program
derives its piece from its own sequence's visible length on the device, so the grid depends only
on the batch size and the static maximum context and the launch can sit inside a CUDA graph.

With a sliding window the pieces cover only the window's positions. Softcap and sinks are
compile-time switches: a layer without them runs the same code as before.
"""

from __future__ import annotations

import torch

from rollout.kernels.arrival_counters import ARRIVALS
from rollout.kernels.tiling import KEYS_WIDE_MAX_ROWS, DecodeTiles, page_run
from rollout.kernels.triton_attention_tiles import (
    add_sinks,
    dot_precision,
    fold_tile,
    fold_tile_keys_wide,
    fp16_keys,
    kv_scale_args,
    load_kv_tile,
    query_for_tiles,
    reads_v_by_token,
    scale_scores,
    scores_keys_wide,
    soft_cap,
    tile_visible,
)
from rollout.kernels.triton_fp8_widen import fast_widen
from rollout.kernels.triton_import import tl, triton

DECODE_TILES = DecodeTiles()

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, sinks_ptr,
    part_out_ptr, part_lse_ptr, arrivals_ptr, out_ptr,
    scale, window, softcap, splits_wanted, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cblock, stride_cslot, stride_chead, stride_bt,
    k_scale_ptr, v_scale_ptr, stride_sblock, stride_sslot, stride_shead, FP8_KV: tl.constexpr,
    FAST_WIDEN: tl.constexpr, K_F16: tl.constexpr,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    QUERY_LEN: tl.constexpr, ROWS_PAD: tl.constexpr, MERGE_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, PAGE: tl.constexpr, PAGE_RUN: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_LEN: tl.constexpr, MERGE_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    V_BY_TOKEN: tl.constexpr, KEYS_WIDE: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + s)
    # Row r: query token r // GROUP of this sequence (at position seq_len - QUERY_LEN + that),
    # head r % GROUP of this KV head's group.
    r = tl.arange(0, ROWS_PAD)
    row_mask = r < GROUP * QUERY_LEN
    token = s * QUERY_LEN + r // GROUP
    heads = kv_head * GROUP + r % GROUP
    q_pos = seq_len - QUERY_LEN + r // GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    out_ptrs = out_ptr + token[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    out_mask = row_mask[:, None] & d_mask[None, :]
    if seq_len == 0:  # CUDA-graph padding: zeros, so no garbage flows into the padded row
        if split == 0:
            tl.store(out_ptrs, tl.zeros([ROWS_PAD, BLOCK_D], out_ptr.dtype.element_ty), out_mask)
        return
    lo = seq_len * 0  # first position any row sees
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - QUERY_LEN - window + 1, 0)
        if V_BY_TOKEN:  # tiles from a page run's start (load_kv_tile); the window masks the rest
            lo = lo // PAGE_RUN * PAGE_RUN
    # This sequence's piece length: its visible context over the pieces wanted, in whole tiles,
    # between one tile and SPLIT_LEN. The host sized the grid so the pieces always fit.
    piece = tl.cdiv(tl.cdiv(seq_len - lo, splits_wanted), BLOCK_N) * BLOCK_N
    piece = tl.minimum(tl.maximum(piece, BLOCK_N), SPLIT_LEN)
    # A context past the static maximum would need more pieces than the grid has: longer ones.
    longer = tl.cdiv(seq_len - lo, num_splits)
    if V_BY_TOKEN:  # pieces start at a page run's start (load_kv_tile)
        longer = tl.cdiv(longer, PAGE_RUN) * PAGE_RUN
    piece = tl.maximum(piece, longer)
    num_active = tl.cdiv(seq_len - lo, piece)
    if split >= num_active:
        return
    start = lo + split * piece
    end = tl.minimum(start + piece, seq_len)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=out_mask,
        other=0.0,
    )  # [ROWS_PAD, BLOCK_D]
    q, q_back = query_for_tiles(q, K_F16)
    m = tl.full([ROWS_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([ROWS_PAD], tl.float32)
    if KEYS_WIDE:  # an FP8 cache: scores [BLOCK_N, ROWS_PAD], output [BLOCK_D, ROWS_PAD]
        q_t = tl.trans(q)
        acc = tl.zeros([BLOCK_D, ROWS_PAD], tl.float32)
        denom_t = tl.zeros([BLOCK_N, ROWS_PAD], tl.float32)
        # Scores in log2 units (fold_tile_keys_wide), after the softcap where there is one.
        row_factor = q_back * (scale if HAS_SOFTCAP else scale * LOG2E)
    else:
        acc = tl.zeros([ROWS_PAD, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < end
        k, v, k_scale, v_scale = load_kv_tile(
            k_cache_ptr, v_cache_ptr, block_tables_ptr + s * stride_bt, n0, offs, n_mask, d,
            d_mask, kv_head, stride_cblock, stride_cslot, stride_chead, PAGE, PAGE_RUN,
            k_scale_ptr, v_scale_ptr, stride_sblock, stride_sslot, stride_shead, q_ptr, FP8_KV,
            FAST_WIDEN, K_F16, V_BY_TOKEN, HEAD_DIM,
        )  # fmt: skip
        if KEYS_WIDE:
            qk = scores_keys_wide(k, q_t, k_scale, row_factor, DOT_PRECISION)
            if HAS_SOFTCAP:
                qk = soft_cap(qk, softcap) * LOG2E
        else:
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            qk = scale_scores(qk, k_scale, q_back, FP8_KV, K_F16)  # [ROWS_PAD, BLOCK_N]
            if HAS_SOFTCAP:
                qk = soft_cap(qk, softcap)
        qk = tl.where(
            tile_visible(offs, n_mask, q_pos, window, QUERY_LEN, HAS_WINDOW, KEYS_WIDE),
            qk, float("-inf"),
        )  # fmt: skip
        if KEYS_WIDE:
            m, denom_t, acc = fold_tile_keys_wide(qk, v, v_scale, m, denom_t, acc, DOT_PRECISION)
        else:
            m, denom, acc = fold_tile(qk, v, v_scale, m, denom, acc, DOT_PRECISION, FP8_KV)
    if KEYS_WIDE:
        acc = tl.trans(acc)  # once a program, not a tile
        denom = tl.sum(denom_t, 0)
        m = m * LN2  # back to natural units
    if num_active == 1:  # the whole visible context fit one piece: no partials, no merge
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=row_mask, other=0.0).to(tl.float32)
            m, denom, acc = add_sinks(m, denom, acc, sink)
        out = tl.where(denom[:, None] > 0, acc / tl.maximum(denom, 1e-30)[:, None], 0.0)
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), out_mask)
        return

    # Several pieces: publish this one's partial result, and let whichever piece of this
    # (sequence, KV head) arrives last merge them all by log-sum-exp. That saves a second kernel
    # launch per layer. The barrier makes every thread's partial stores precede the release.
    # (A row that saw no position of this piece publishes 0 with a log-weight of -inf.)
    part_rows = (token[:, None] * NUM_HEADS + heads[:, None]) * num_splits
    part_ptrs = part_out_ptr + part_rows * HEAD_DIM + d[None, :]
    lse_ptrs = part_lse_ptr + (token * NUM_HEADS + heads) * num_splits
    part = tl.where(denom[:, None] > 0, acc / tl.maximum(denom, 1e-30)[:, None], 0.0)
    tl.store(part_ptrs + split * HEAD_DIM, part, mask=out_mask)
    tl.store(lse_ptrs + split, m + tl.log(denom), mask=row_mask)
    tl.debug_barrier()
    arrivals = arrivals_ptr + s * NUM_KV_HEADS + kv_head
    arrived_before = tl.atomic_add(arrivals, 1, sem="acq_rel")
    if arrived_before == num_active - 1:
        tl.store(arrivals, 0)  # reset for the next launch (the next layer or step)
        # All rows at once, MERGE_CHUNK pieces per load (a few L2 round trips, not one per
        # piece and row: this runs on the kernel's critical path). .cg reads through L2, where
        # the other programs' stores landed (L1 is not coherent across SMs).
        mr = tl.arange(0, MERGE_ROWS)
        mr_mask = mr < GROUP * QUERY_LEN
        m_token = s * QUERY_LEN + mr // GROUP
        m_heads = kv_head * GROUP + mr % GROUP
        rows = m_token * NUM_HEADS + m_heads  # [MERGE_ROWS]
        c = tl.arange(0, MERGE_CHUNK)
        m_all = tl.full([MERGE_ROWS], float("-inf"), tl.float32)
        weight = tl.zeros([MERGE_ROWS], tl.float32)
        if HAS_SINKS:  # the sink joins the merge as a part with a weight and no value
            m_all = tl.load(sinks_ptr + m_heads, mask=mr_mask, other=0.0).to(tl.float32)
            weight = tl.full([MERGE_ROWS], 1.0, tl.float32)
        merged = tl.zeros([MERGE_ROWS, BLOCK_D], tl.float32)
        for c0 in range(0, num_active, MERGE_CHUNK):
            pieces = c0 + c
            chunk_mask = mr_mask[:, None] & (pieces < num_active)[None, :]  # [rows, chunk]
            slot = rows[:, None] * num_splits + pieces[None, :]
            lse = tl.load(part_lse_ptr + slot, mask=chunk_mask, other=float("-inf"),
                          cache_modifier=".cg")  # fmt: skip
            parts = tl.load(
                part_out_ptr + slot[:, :, None] * HEAD_DIM + d[None, None, :],
                mask=chunk_mask[:, :, None] & d_mask[None, None, :], other=0.0,
                cache_modifier=".cg",
            )  # fmt: skip
            m_new = tl.maximum(m_all, tl.max(lse, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no weight yet: no inf - inf
            alpha = tl.exp(m_all - m_use)
            w = tl.exp(lse - m_use[:, None])
            merged = merged * alpha[:, None] + tl.sum(parts * w[:, :, None], 1)
            weight = weight * alpha + tl.sum(w, 1)
            m_all = m_new
        head_out = (
            out_ptr + m_token[:, None] * stride_ot + m_heads[:, None] * stride_oh + d[None, :]
        )
        out = tl.where(weight[:, None] > 0, merged / tl.maximum(weight, 1e-30)[:, None], 0.0)
        tl.store(
            head_out, out.to(out_ptr.dtype.element_ty), mask=mr_mask[:, None] & d_mask[None, :]
        )


def decode_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    scale,
    max_seq_len_static,
    tiles=None,
    window=None,
    softcap=None,
    sinks=None,
    query_len=1,
    kv_scales=None,
):
    """query [num_seqs x query_len, num_heads, head_dim] -> same shape: `query_len` tokens per
    sequence (1: decode), the last positions of its seq_lens context, in order. `tiles`: the
    launch shape, this module's DECODE_TILES when None (read at each call, so a benchmark can
    swap it). `kv_scales`: an FP8 cache's (k_scale, v_scale)."""
    tiles = tiles or DECODE_TILES
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens != num_seqs * query_len:
        raise ValueError(
            f"decode_attention: {num_tokens} query tokens for {num_seqs} sequences of "
            f"{query_len} tokens each"
        )
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # Pieces a visible context of up to this many positions may be cut into (the grid's depth).
    max_visible = max_seq_len_static
    if window is not None:
        max_visible = min(max_seq_len_static, window + query_len - 1)
    rows = group * query_len
    keys_wide = kv_scales is not None and bool(tiles.fp8_keys_wide) and rows <= KEYS_WIDE_MAX_ROWS
    one_warp = tiles.one_warp_tiles(
        num_seqs * num_kv_heads, kv_scales is not None, keys_wide, k_cache.shape[1]
    )
    splits_wanted, split_len, num_splits = tiles.pieces(
        num_seqs, num_kv_heads, max_visible, kv_scales is not None, one_warp
    )
    part_out = torch.empty(
        num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
    )
    part_lse = torch.empty(
        num_tokens, num_heads, num_splits, dtype=torch.float32, device=query.device
    )
    arrivals = ARRIVALS.get(query.device, num_seqs * num_kv_heads)
    if arrivals is None:
        raise RuntimeError(
            "decode attention needs new arrival counters during CUDA-graph capture; run the step "
            "once eagerly on the capture stream first (the graph runner's warm-up does)"
        )
    out = torch.empty_like(query)
    merge_rows = max(2, triton.next_power_of_2(rows))
    merge_pairs = tiles.merge_load_pairs(one_warp)
    merge_chunk = max(1, min(16, merge_pairs // merge_rows, triton.next_power_of_2(num_splits)))
    k_f16 = fp16_keys(query, kv_scales is not None)
    by_token = reads_v_by_token(k_cache, v_cache, kv_scales is not None)
    block_n, num_warps = tiles.tile_shape(one_warp)
    run = page_run(k_cache.shape[1], block_n, by_token, "decode_attention")
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, sinks if sinks is not None else query,
        part_out, part_lse, arrivals, out,
        scale, window or 0, softcap or 0.0, splits_wanted, num_splits,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *kv_scale_args(k_cache, kv_scales), FP8_KV=kv_scales is not None,
        FAST_WIDEN=kv_scales is not None and fast_widen(query.dtype, query.device),
        K_F16=k_f16,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group, QUERY_LEN=query_len,
        # padded rows are masked and never stored
        ROWS_PAD=KEYS_WIDE_MAX_ROWS if keys_wide else max(16, triton.next_power_of_2(rows)),
        MERGE_ROWS=merge_rows,
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1],
        PAGE_RUN=run, BLOCK_N=block_n, SPLIT_LEN=split_len,
        MERGE_CHUNK=merge_chunk,
        DOT_PRECISION=dot_precision(query), HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None, HAS_SINKS=sinks is not None,
        V_BY_TOKEN=by_token, KEYS_WIDE=keys_wide,
        num_warps=num_warps, num_stages=tiles.stages(one_warp),
        **({"maxnreg": cap} if (cap := tiles.register_cap(one_warp)) else {}),
    )  # fmt: skip
    return out
