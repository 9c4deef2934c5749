"""The PyTorch twin of the rounded RMSNorm (`triton_rounded_norm`), and what the engine runs off
the GPU: a decoder layer's residual add and RMSNorm, as transformers' Llama-family layers compute
them, with the norm's output rounded as FP8 activations round a projection's input."""

from __future__ import annotations

import torch

from rollout.kernels.torch_fp8 import (
    dequantize_groups,
    dequantize_rows,
    quantize_groups,
    quantize_rows,
)


def rms_norm_rounded(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    grouped: bool,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, q, scale): h = residual + x (x without a residual), y = RMSNorm(h) * weight
    rounded to e4m3 with a power-of-two scale per row, or per 128 inputs of a row with
    `grouped` (`torch_fp8.quantize_rows` / `quantize_groups`), in y's dtype (exact), and its FP8
    form q, scale: y == dequantize(q, scale)."""
    h = x if residual is None else residual + x
    hidden = h.float()
    variance = hidden.pow(2).mean(-1, keepdim=True)
    y = weight * (hidden * torch.rsqrt(variance + eps)).to(h.dtype)
    q, scale = quantize_groups(y) if grouped else quantize_rows(y)
    rounded = (dequantize_groups if grouped else dequantize_rows)(q, scale, y.dtype)
    return h, rounded, q, scale
