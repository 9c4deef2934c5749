"""Reading K/V from the paged cache inside a Triton kernel (shared by decode and prefill/extend)."""

from __future__ import annotations

import triton
import triton.language as tl


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
