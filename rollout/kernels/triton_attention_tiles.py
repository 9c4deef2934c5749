"""What the decode and prefill/extend kernels share, per K/V tile: reading it from the paged cache,
capping its logits, folding it into the running (online) softmax, and the sinks at the end."""

from __future__ import annotations

import contextlib

import torch

from rollout.kernels.tiling import V_BY_TOKEN_MAX_PAGE, lays_out_v_by_token
from rollout.kernels.triton_fp8_widen import widen_e4m3
from rollout.kernels.triton_import import tl, triton

FP8_KV_TILES = "fp16 K"
"""What bf16 activations widen an FP8 cache's tiles to (`fp16_keys`): "fp16 K" (K in fp16, V in
bf16) or "bf16" (both); benchmarks and tests set it to compare."""


@contextlib.contextmanager
def fp8_kv_tiles(choice: str):
    """FP8_KV_TILES set to `choice` within the block (benchmarks and tests compare the choices;
    a CUDA graph keeps what it captured)."""
    global FP8_KV_TILES
    before, FP8_KV_TILES = FP8_KV_TILES, choice
    try:
        yield
    finally:
        FP8_KV_TILES = before


def fp16_keys(query: torch.Tensor, fp8_kv: bool) -> bool:
    """Whether a launch over an FP8 cache widens its K tiles to fp16 rather than to the query's
    bf16. e4m3 -> fp16 is one conversion instruction per two values on NVIDIA GPUs, e4m3 -> bf16
    five integer ones (`triton_fp8_widen`); the two run on different units, so K in fp16 and V
    in bf16 splits the widening between them. The query enters the score dot in fp16, scaled by
    a power of two per row (`query_for_tiles`: the same scores)."""
    if not fp8_kv or query.dtype != torch.bfloat16 or FP8_KV_TILES == "bf16":
        return False
    if FP8_KV_TILES != "fp16 K":
        raise ValueError(f"FP8_KV_TILES is {FP8_KV_TILES!r}: 'fp16 K' or 'bf16'")
    return True


def reads_v_by_token(k_cache: torch.Tensor, v_cache: torch.Tensor, fp8_kv: bool) -> bool:
    """Whether the V cache's pages hold each (head, dim)'s tokens side by side ([block, head,
    dim, slot] in memory, seen as [block, slot, head, dim] like K): how an FP8 cache lays out V
    (`torch_paged_attention.v_by_token`), read by `load_kv_tile`. Refused where the kernels
    cannot read it so: a bf16 cache, blocks unlike K's, pages the tiles do not hold whole."""
    _, page, _, dim = v_cache.shape
    if v_cache.stride(1) != 1 or v_cache.stride(3) != page or v_cache.stride(2) != page * dim:
        return False
    if not (fp8_kv and v_cache.stride(0) == k_cache.stride(0) and lays_out_v_by_token(page)):
        raise ValueError(
            "decode/extend attention: V laid out by token needs an FP8 cache "
            "(kv_cache_dtype='fp8'), K's block stride and pages of a power of two up to "
            f"{V_BY_TOKEN_MAX_PAGE} tokens; got {v_cache.dtype}, block strides "
            f"{k_cache.stride(0)} and {v_cache.stride(0)}, pages of {page}"
        )
    return True


def dot_precision(query: torch.Tensor) -> str:
    """Precision of tl.dot: fp32 models (tests, exactness) get full-precision dots; bf16/fp16
    inputs ignore the setting."""
    return "ieee" if query.dtype == torch.float32 else "tf32"


@triton.jit
def page_start(page, stride):
    """page x stride in int64 (a cache of over 2^31 elements passes int32), as one unsigned
    32 x 32 -> 64-bit multiply: pages and strides are never negative."""
    return page.to(tl.uint32).to(tl.int64) * stride.to(tl.uint32).to(tl.int64)


@triton.jit
def tile_visible(offs, n_mask, q_pos, window, QUERY_LEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 KEYS_WIDE: tl.constexpr):  # fmt: skip
    """Which (row, position) pairs of a tile a row may see: inside the piece, causal among the
    step's own tokens, inside the window; laid out [tile, rows] for the keys-wide tiles, else
    [rows, tile]."""
    if KEYS_WIDE:
        position, row_position, visible = offs[:, None], q_pos[None, :], n_mask[:, None]
    else:
        position, row_position, visible = offs[None, :], q_pos[:, None], n_mask[None, :]
    if QUERY_LEN > 1:  # causal among the step's own tokens
        visible &= position <= row_position
    if HAS_WINDOW:
        visible &= position > row_position - window
    return visible


@triton.jit
def load_kv_tile(
    k_cache_ptr, v_cache_ptr, block_table_ptr, tile_start, offs, n_mask, d, d_mask, kv_head,
    stride_cblock, stride_cslot, stride_chead, PAGE: tl.constexpr, PAGE_RUN: tl.constexpr,
    k_scale_ptr, v_scale_ptr, stride_sblock, stride_sslot, stride_shead, like_ptr,
    FP8_KV: tl.constexpr, FAST_WIDEN: tl.constexpr, K_F16: tl.constexpr, V_BY_TOKEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """K and V at context positions `offs` (tile_start + arange) of the sequence whose
    block-table row starts at `block_table_ptr`: [len(offs), BLOCK_D] each, zeros where `n_mask`
    or `d_mask` is off, and their (token, head) scales [len(offs)]. An FP8 cache's bytes are
    widened into `like_ptr`'s dtype (K into fp16 with K_F16) unscaled: the caller multiplies the
    scores by the K scales (`scale_scores`) and the probabilities by the V scales (`fold_tile`),
    a few multiplies a token instead of three conversions an element, and exact as the scales
    are powers of two. Without an FP8 cache the scales are never used (and compiled away).

    With V_BY_TOKEN, V's pages hold each (head, dim)'s tokens side by side ([block, head, dim,
    slot] in memory, `torch_paged_attention.v_by_token`): runs of PAGE_RUN tokens, the tile's
    or the page's length whichever is shorter (`tiling.page_run`; `offs` must start at a
    multiple of it: whole pages a tile, or a tile within one page), load as vectors and widen
    straight into the MMA's operand layout, as K does along its dims. They load unmasked along
    the tokens (a masked load would not vectorize), so the slots of the last page past the
    context are read too."""
    TILE: tl.constexpr = offs.shape[0]
    if V_BY_TOKEN and PAGE_RUN == TILE:
        # A tile within one page (its start a multiple of PAGE_RUN, inside the context): one
        # table entry for all its tokens, loaded once, and their slots side by side.
        first = tl.cast(tile_start, tl.uint32)
        page = tl.load(block_table_ptr + first // PAGE)
        slot = (first % PAGE).to(tl.int32) + tl.arange(0, TILE)
    else:
        # offs >= 0: unsigned, so the page and slot are a shift and a mask, not a signed division.
        page = tl.load(block_table_ptr + offs.to(tl.uint32) // PAGE, mask=n_mask, other=0)
        slot = (offs.to(tl.uint32) % PAGE).to(tl.int32)
    row = page_start(page, stride_cblock) + (slot * stride_cslot + kv_head * stride_chead)
    # K loads unmasked along the tokens: a score past the context is masked (-inf) by the caller
    # whatever its key holds, and a page past the sequence's reads as page 0 (the table's load
    # is masked; a tile within one page starts inside the sequence, so its page is the
    # sequence's), so every address stays inside the cache.
    k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=d_mask[None, :], other=0.0)
    if V_BY_TOKEN:
        slot = tl.max_contiguous(tl.multiple_of(slot, PAGE_RUN), PAGE_RUN)
        v_page = page if PAGE_RUN == TILE else tl.max_constancy(page, PAGE_RUN)
        v_row = page_start(v_page, stride_cblock) + (kv_head * (PAGE * HEAD_DIM) + slot)
        v = tl.load(
            v_cache_ptr + v_row[:, None] + d[None, :] * PAGE, mask=d_mask[None, :], other=0.0
        )
    else:
        kv_mask = n_mask[:, None] & d_mask[None, :]
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if FP8_KV:
        scale_row = page_start(page, stride_sblock) + (slot * stride_sslot + kv_head * stride_shead)
        k_scale = tl.load(k_scale_ptr + scale_row, mask=n_mask, other=0.0)
        v_scale = tl.load(v_scale_ptr + scale_row, mask=n_mask, other=0.0)
        # In the MMA's operand layout (not where loaded) either way: Triton then lays the score
        # dot out alike for the integer widening and its cast, so both sum in one order.
        k_type: tl.constexpr = tl.float16 if K_F16 else like_ptr.dtype.element_ty
        k = widen_e4m3(k, k_type, FAST_WIDEN, not V_BY_TOKEN)
        v = widen_e4m3(v, like_ptr.dtype.element_ty, FAST_WIDEN, not V_BY_TOKEN)
        if V_BY_TOKEN and not FAST_WIDEN:
            # Loaded unmasked: past the context lie another sequence's leftovers, whose weight
            # is 0, but 0 x NaN is NaN. The integer widening turns every byte into a finite
            # value (e4m3's NaN reads as 480); Triton's cast does not.
            v = tl.where(n_mask[:, None], v, 0.0)
    else:
        k_scale = n_mask.to(tl.float32)
        v_scale = k_scale
    return k, v, k_scale, v_scale


@triton.jit
def query_for_tiles(q, K_F16: tl.constexpr):
    """(q as the score dot takes it, each row's factor back [rows]). With K_F16 each row of
    `q` times the power of two that brings its largest magnitude into [2^14, 2^15), in fp16:
    exact for every element above 2^-29 of that largest (fp16's normal range; bf16 has fewer
    mantissa bits), no overflow, and the fp32 products and sums of the dot are the unscaled
    ones times that power of two, which the factor back removes exactly."""
    if K_F16:
        amax = tl.max(tl.abs(q.to(tl.float32)), 1)
        exponent = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 amax)
        up = tl.minimum(tl.maximum(14 - exponent, -126), 126)
        times = ((up + 127) << 23).to(tl.float32, bitcast=True)
        back = ((127 - up) << 23).to(tl.float32, bitcast=True)
        return (q.to(tl.float32) * times[:, None]).to(tl.float16), back
    else:
        return q, tl.full([q.shape[0]], 1.0, tl.float32)


@triton.jit
def scale_scores(qk, k_scale, q_back, FP8_KV: tl.constexpr, K_F16: tl.constexpr):
    """The scores [rows, tile] of an FP8 tile's unscaled keys times each key's scale (and with
    K_F16 each row's factor back from `query_for_tiles`)."""
    if K_F16:
        qk = qk * q_back[:, None]
    if FP8_KV:
        qk = qk * k_scale[None, :]
    return qk


@triton.jit
def scores_keys_wide(k, q_t, k_scale, row_factor, DOT_PRECISION: tl.constexpr):
    """The scores [tile, rows] of an FP8 tile's unscaled keys `k` against the query's transpose,
    each row times its `row_factor` (`query_for_tiles`' factor back, times the softmax scale,
    times log2(e) where the caller takes exp2) and each key times its scale."""
    qk_t = tl.dot(k, q_t, input_precision=DOT_PRECISION)
    return qk_t * row_factor[None, :] * k_scale[:, None]


@triton.jit
def pow2_scale(amax):
    """`torch_fp8.pow2_scales` and its exact inverse, from amax's bits: the smallest power of
    two s with amax / s <= 448 (1 where amax is 0)."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    mantissa = bits & 0x7FFFFF
    k = tl.maximum(exponent - 8 + (mantissa > 0x600000).to(tl.int32), -126)
    scale = ((k + 127) << 23).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, scale, 1.0)
    inverse = ((254 << 23) - scale.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit
def e4m3_bits(x):
    """The e4m3 byte of each fp32 value in [-448, 448], rounded to nearest even, from its bits
    (as torch's cast and the GPU's cvt.rn round; written out so that every backend, Triton's
    CPU interpreter included, stores the same bytes)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    exponent = (magnitude >> 23) - 127
    mantissa = magnitude & 0x7FFFFF
    # Normal (|x| >= 2^-6): keep 3 mantissa bits; a carry out of them raises the exponent.
    kept = mantissa >> 20
    rest = mantissa & 0xFFFFF
    up = (rest > 0x80000) | ((rest == 0x80000) & ((kept & 1) == 1))
    normal = ((exponent + 7) << 3) + kept + up.to(tl.int32)
    # Subnormal (|x| < 2^-6): the value in steps of 2^-9, rounded half to even (8 is the
    # smallest normal's code, so a carry needs nothing more).
    steps = tl.abs(x) * 512.0
    whole = tl.floor(steps)
    half_up = (steps - whole > 0.5) | ((steps - whole == 0.5) & (whole % 2 == 1))
    subnormal = (whole + half_up.to(tl.float32)).to(tl.int32)
    code = tl.where(exponent >= -6, normal, subnormal)
    return (sign | code).to(tl.uint8)


def kv_scale_args(k_cache: torch.Tensor, kv_scales) -> tuple:
    """(k_scale, v_scale, stride_sblock, stride_sslot, stride_shead) for a launch: an FP8
    cache's scales (K's and V's laid out alike, by head or not: `scales_by_head`), or the cache
    itself as never-read stand-ins."""
    if kv_scales is None:
        return k_cache, k_cache, 0, 0, 0
    k_scale, v_scale = kv_scales
    if k_scale.stride() != v_scale.stride():
        raise ValueError(
            f"an FP8 cache's K and V scales must share a layout; strides {k_scale.stride()} "
            f"and {v_scale.stride()}"
        )
    return k_scale, v_scale, *k_scale.stride()


@triton.jit
def fold_tile(
    qk, v, v_scale, m, denom, acc, DOT_PRECISION: tl.constexpr, FP8_KV: tl.constexpr,
):  # fmt: skip
    """Fold one tile's scores `qk` [rows, tile] (-inf where masked) and values `v` into the
    running max `m`, normaliser `denom` [rows] and output `acc` [rows, BLOCK_D]. A row with
    every position masked so far stays at m = -inf, denom = 0, acc = 0. An FP8 tile's values
    are unscaled: each probability takes its value's scale before the product (a power of two,
    so the rounded product is the one of the scaled values)."""
    m_new = tl.maximum(m, tl.max(qk, 1))
    # A row that has seen no visible position yet keeps -inf; exp(-inf - -inf) would be NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(qk - m_safe[:, None])
    alpha = tl.exp(m - m_safe)  # rescales what was accumulated under the old max
    denom = denom * alpha + tl.sum(p, 1)
    weights = p
    if FP8_KV:
        weights = p * v_scale[None, :]
    acc = acc * alpha[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, denom, acc


@triton.jit
def fold_tile_keys_wide(qk_t, v, v_scale, m, denom_t, acc_t, DOT_PRECISION: tl.constexpr):
    """`fold_tile` for an FP8 tile with the tile's tokens on the MMA's wide side, its scores and
    running max in log2 units (times log2(e): exp2 is one instruction, exp two): scores `qk_t`
    [tile, rows] (K times the query's transpose), output `acc_t` [BLOCK_D, rows] (V's transpose
    times the weights). The MMA's narrow side is at least 8 wide (16 on its other side), so a
    KV head's few query rows (4 for 32 heads over 8) fill half of it, not a quarter, and the
    softmax works on [tile, rows] instead of [16, tile]. The normaliser stays unsummed,
    `denom_t` [tile, rows] (summed over the tile once, after the last tile): a tile's tokens lie
    across the program's warps, so each sum over them costs a round trip through shared memory
    and a barrier. Same sums as `fold_tile`."""
    m_new = tl.maximum(m, tl.max(qk_t, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk_t - m_safe[None, :])
    alpha = tl.exp2(m - m_safe)
    denom_t = denom_t * alpha[None, :] + p
    weights = p * v_scale[:, None]
    acc_t = acc_t * alpha[None, :] + tl.dot(
        tl.trans(v), weights.to(v.dtype), input_precision=DOT_PRECISION
    )
    return m_new, denom_t, acc_t


@triton.jit
def soft_cap(qk, softcap):
    """softcap * tanh(qk / softcap), with tanh from exp (no libdevice: the CPU interpreter runs
    this too): tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|), which cannot overflow."""
    x = qk / softcap
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return softcap * tl.where(x < 0, -t, t)


@triton.jit
def add_sinks(m, denom, acc, sink):
    """Let each row's sink logit `sink` [rows] join the softmax's denominator (it carries no
    value): the running max, normaliser and output rescaled to the new max."""
    m_new = tl.maximum(m, sink)
    alpha = tl.exp(m - m_new)
    return m_new, denom * alpha + tl.exp(sink - m_new), acc * alpha[:, None]
