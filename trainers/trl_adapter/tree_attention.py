"""Training attention for AsyncGRPOTrainer's prefix-tree packed rows, without any Hub kernel.

TRL packs a step's samples into a trie: each segment of the row attends to the K/V of its
root-to-segment path (`tree_kv_index[cu_k[s]:cu_k[s+1]]`, whose last rows are the segment itself),
causally with the mask aligned bottom-right. TRL runs this with an FA3 kernel fetched from the Hub
at first use, impossible offline. Here: torch's own FlashAttention varlen kernel on CUDA (it has a
backward), and per-segment fp32 attention elsewhere (memory grows with each segment's
query x path, never with the whole row squared). Plain "sdpa" is not a substitute: it would let
samples attend to each other.
"""

from __future__ import annotations

import torch

TREE_ATTENTION_NAME = "rollout_tree"


def tree_attention(
    module,
    query: torch.Tensor,  # [1, num_heads, num_tokens, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, num_tokens, head_dim]
    value: torch.Tensor,
    attention_mask,
    *,
    tree_kv_index: torch.Tensor,
    tree_cu_seqlens_q: torch.Tensor,
    tree_cu_seqlens_k: torch.Tensor,
    tree_max_seqlen_q: int,
    tree_max_seqlen_k: int,
    scaling: float | None = None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    if sliding_window or softcap:
        raise NotImplementedError("tree attention fallback: no sliding window or softcap")
    q = query.transpose(1, 2)[0]  # [N, H, D]
    k = key.transpose(1, 2)[0].index_select(0, tree_kv_index)  # [K, Hkv, D]
    v = value.transpose(1, 2)[0].index_select(0, tree_kv_index)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        out = torch.ops.aten._flash_attention_forward(
            q, k, v, tree_cu_seqlens_q, tree_cu_seqlens_k,
            int(tree_max_seqlen_q), int(tree_max_seqlen_k), 0.0, True, False, scale=scale,
        )[0]  # fmt: skip
    else:
        out = _per_segment(q, k, v, tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist(), scale)
    return out.unsqueeze(0), None


def _per_segment(q, k, v, cu_q: list[int], cu_k: list[int], scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    outs = []
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s] : cu_q[s + 1]].transpose(0, 1).float()  # [H, Q, D]
        ks = (
            k[cu_k[s] : cu_k[s + 1]].repeat_interleave(group, 1).transpose(0, 1).float()
        )  # [H, L, D]
        vs = v[cu_k[s] : cu_k[s + 1]].repeat_interleave(group, 1).transpose(0, 1).float()
        num_q, num_k = qs.shape[1], ks.shape[1]
        visible = torch.ones(num_q, num_k, dtype=torch.bool, device=q.device).tril(num_k - num_q)
        scores = (qs @ ks.transpose(1, 2)) * scale
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        outs.append((probs @ vs).transpose(0, 1).to(q.dtype))
    return torch.cat(outs, dim=0)


def register_tree_attention() -> str:
    """Register under our own name (TRL re-registers its own name at trainer construction)."""
    from transformers import AttentionInterface

    AttentionInterface.register(TREE_ATTENTION_NAME, tree_attention)
    return TREE_ATTENTION_NAME
