"""Paged attention in plain PyTorch: the CPU path and the oracle for the Triton kernels.

Cache layout (one layer): k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim].
An FP8 cache's V is laid out by token in memory ([num_blocks, num_kv_heads, head_dim,
block_size], seen through that shape: `v_by_token`), which the code here reads like any other.
A step's tokens are packed: sequence s owns query rows [query_start_loc[s], query_start_loc[s + 1])
and, after this step's KV write, has seq_lens[s] tokens of context in the blocks block_tables[s].
Its queries are the last tokens of that context (causal mask aligned bottom-right). An FP8 cache
holds e4m3 rows with a power-of-two scale per (token, KV head) beside them (`quantize_kv`; laid
out head by head in memory: `scales_by_head`); reads widen them to fp32 first.

Three per-layer variants, as transformers' own attention computes them:
- `window`: a sliding window; a query at position p sees positions p - window + 1 .. p.
- `softcap`: the scaled logits go through softcap * tanh(logits / softcap) before the softmax.
- `sinks`: one learned logit per query head that joins the softmax's denominator and carries no
  value (attention may go "nowhere").
"""

from __future__ import annotations

import torch

from rollout.kernels.torch_fp8 import quantize_kv


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64; slot = block * block_size + offset; < 0: skip
    k_scale: torch.Tensor | None = None,  # FP8 cache: [num_blocks, block_size, num_kv_heads]
    v_scale: torch.Tensor | None = None,
) -> None:
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    blocks, offsets = slot_mapping[keep] // block_size, slot_mapping[keep] % block_size
    for x, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        rows = x[keep]
        if scale is not None:
            rows, scales = quantize_kv(rows)
            scale[blocks, offsets] = scales
        cache[blocks, offsets] = rows.to(cache.dtype)  # whatever the cache's strides


def v_by_token(v_cache: torch.Tensor) -> torch.Tensor:
    """The same values laid out by token in memory ([num_blocks, num_kv_heads, head_dim,
    block_size]), seen as [num_blocks, block_size, num_kv_heads, head_dim]: how an FP8 cache
    holds V, so that the Triton kernels read its tiles straight into the MMA."""
    return v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def keys_by_head(k_cache: torch.Tensor) -> torch.Tensor:
    """The same keys laid out head by head in memory ([num_blocks, num_kv_heads, block_size,
    head_dim]), seen as [num_blocks, block_size, num_kv_heads, head_dim]: how an FP8 cache
    holds K beside V by token, so that a page's keys of one KV head are one run of bytes."""
    return k_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def scales_by_head(scale: torch.Tensor) -> torch.Tensor:
    """An FP8 cache's scales [num_blocks, block_size, num_kv_heads] laid out head by head in
    memory ([num_blocks, num_kv_heads, block_size]) and seen through the same shape: how the
    engine holds them, so that a program reading one KV head's tile loads its tokens' scales
    from a few adjacent bytes, not one 32-byte sector each."""
    return scale.permute(0, 2, 1).contiguous().permute(0, 2, 1)


def _pages(cache, scale, pages) -> torch.Tensor:
    """The cache's `pages` [..., P] as fp32 [..., P x block_size, num_kv_heads, head_dim],
    an FP8 cache's widened by its scales."""
    rows = cache[pages].float()
    if scale is not None:
        rows = rows * scale[pages][..., None]
    return rows.flatten(-4, -3)


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: list[int],  # num_seqs + 1 host ints
    seq_lens: list[int],  # num_seqs host ints (context length after this step's write)
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,  # an FP8 cache's
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Gather each sequence's pages and attend in fp32 with an explicit bottom-right causal mask."""
    k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
    if len(seq_lens) > 1 and list(query_start_loc) == list(range(len(seq_lens) + 1)):
        return _decode_batched(
            query, (k_cache, k_scale), (v_cache, v_scale), block_tables, seq_lens, scale,
            window, softcap, sinks,
        )  # fmt: skip
    num_heads = query.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    for s, seq_len in enumerate(seq_lens):
        q_start, q_end = query_start_loc[s], query_start_loc[s + 1]
        num_queries = q_end - q_start
        if num_queries == 0:
            continue
        num_pages = -(-seq_len // block_size)
        pages = block_tables[s, :num_pages].long()
        k = _pages(k_cache, k_scale, pages)[:seq_len]  # [L, Hkv, D]
        v = _pages(v_cache, v_scale, pages)[:seq_len]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        q = query[q_start:q_end].float().transpose(0, 1)  # [H, Q, D]
        scores = _capped(torch.matmul(q, k.transpose(1, 2)) * scale, softcap)  # [H, Q, L]
        # Query i sits at absolute position seq_len - num_queries + i and sees keys up to it.
        q_pos = torch.arange(seq_len - num_queries, seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        hidden = k_pos[None, :] > q_pos[:, None]
        if window is not None:
            hidden |= k_pos[None, :] <= q_pos[:, None] - window
        scores.masked_fill_(hidden, float("-inf"))
        probs = _softmax(scores, sinks)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out


def _capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def _softmax(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim, heads on dim -3; with sinks, each head's sink logit joins
    the denominator."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.float().view(-1, 1, 1).expand(*scores.shape[:-1], 1)  # [..., H, Q, 1]
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def _decode_batched(
    query, keys, values, block_tables, seq_lens: list[int], scale: float, window, softcap, sinks
):
    """One query per sequence: gather all pages at once and attend with a length mask (the CPU
    decode path; a per-sequence loop costs a few ops per sequence and layer). `keys`, `values`:
    (cache, an FP8 cache's scales or None)."""
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = keys[0].shape[1], keys[0].shape[2]
    group = num_heads // num_kv_heads
    max_pages = -(-max(seq_lens) // block_size)
    pages = block_tables[:, :max_pages].long()  # [S, P]
    k = _pages(*keys, pages)  # [S, L, Hkv, D]
    v = _pages(*values, pages)
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = _capped(torch.einsum("skgd,slkd->skgl", q, k) * scale, softcap)  # [S, Hkv, G, L]
    lengths = torch.tensor(seq_lens, device=query.device)
    k_pos = torch.arange(k.shape[1], device=query.device)[None, :]
    hidden = k_pos >= lengths[:, None]  # [S, L]
    if window is not None:  # the query sits at lengths - 1
        hidden |= k_pos <= lengths[:, None] - 1 - window
    scores.masked_fill_(hidden[:, None, None, :], float("-inf"))
    # Past a sequence's context lie stale slots (another sequence's, or padding pages): their
    # weight is 0, but 0 x NaN is NaN, so their values go too.
    v = v.masked_fill(hidden[:, :, None, None], 0.0)
    # Heads [Hkv, G] flattened back to H for the sinks, and the softmax over L.
    probs = _softmax(scores.view(num_seqs, num_heads, 1, -1), sinks).view(scores.shape)
    out = torch.einsum("skgl,slkd->skgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
