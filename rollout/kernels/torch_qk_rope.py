"""The PyTorch twin of `triton_qk_rope`: a Qwen3-family attention's per-head RMSNorm of q and k
and the rotary embedding after it, as transformers computes them (each norm in float32 and cast
back, the weight's product in the activations' dtype; rotary as q * cos + rotate_half(q) * sin,
each product rounded to that dtype), on the fused q/k/v projection's output."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama/Qwen3 RMSNorm over x's last dim."""
    hidden = x.float()
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., tokens, heads, head_dim] rotated by cos/sin [..., tokens, head_dim]."""
    return x * cos.unsqueeze(-2) + rotate_half(x) * sin.unsqueeze(-2)


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
    """qkv [..., tokens, (num_q_heads + 2 num_kv_heads) x head_dim] -> [..., tokens,
    num_q_heads + num_kv_heads, head_dim]: the normed, rotated query heads, then the key heads."""
    head_dim = q_weight.shape[0]
    lead = qkv.shape[:-1]
    q_width, k_width = num_q_heads * head_dim, num_kv_heads * head_dim
    query = qkv[..., :q_width].reshape(*lead, num_q_heads, head_dim)
    key = qkv[..., q_width : q_width + k_width].reshape(*lead, num_kv_heads, head_dim)
    query = rotary(rms_norm(query, q_weight, eps), cos, sin)
    key = rotary(rms_norm(key, k_weight, eps), cos, sin)
    return torch.cat((query, key), dim=-2)
