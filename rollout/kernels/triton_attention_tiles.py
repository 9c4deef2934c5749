"""What the decode and prefill/extend kernels share, per K/V tile: reading it from the paged cache,
capping its logits, folding it into the running (online) softmax, and the sinks at the end."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def dot_precision(query: torch.Tensor) -> str:
    """Precision of tl.dot: fp32 models (tests, exactness) get full-precision dots; bf16/fp16
    inputs ignore the setting."""
    return "ieee" if query.dtype == torch.float32 else "tf32"


@triton.jit
def load_kv_tile(
    k_cache_ptr, v_cache_ptr, block_table_ptr, offs, n_mask, d, d_mask, kv_head,
    stride_cblock, stride_cslot, stride_chead, PAGE: tl.constexpr,
):  # fmt: skip
    """K and V at context positions `offs` of the sequence whose block-table row starts at
    `block_table_ptr`: [len(offs), BLOCK_D] each, zeros where `n_mask` or `d_mask` is off."""
    page = tl.load(block_table_ptr + offs // PAGE, mask=n_mask, other=0)
    # int64: block x stride passes int32 in caches of over 2^31 elements.
    row = page.to(tl.int64) * stride_cblock + (offs % PAGE) * stride_cslot + kv_head * stride_chead
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def fold_tile(qk, v, m, denom, acc, DOT_PRECISION: tl.constexpr):
    """Fold one tile's scores `qk` [rows, tile] (-inf where masked) and values `v` into the
    running max `m`, normaliser `denom` [rows] and output `acc` [rows, BLOCK_D]. A row with
    every position masked so far stays at m = -inf, denom = 0, acc = 0."""
    m_new = tl.maximum(m, tl.max(qk, 1))
    # A row that has seen no visible position yet keeps -inf; exp(-inf - -inf) would be NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(qk - m_safe[:, None])
    alpha = tl.exp(m - m_safe)  # rescales what was accumulated under the old max
    denom = denom * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, denom, acc


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
