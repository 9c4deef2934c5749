"""FP8 weights: e4m3 values with one fp32 scale per output channel, and the PyTorch twin of the
FP8 GEMM (the oracle of its tests, and the path where the kernel does not run).

A weight [..., N, K] is stored as q = round_e4m3(w / s) with s = amax over its row / 448 (the
largest e4m3 value), so every row uses the format's whole range; a row of zeros gets s = 1. Its
dequantized value is q * s: what "the model the FP8 engine serves" means. The GEMM computes
y = s * (x @ q.T) in fp32 and rounds once to the activations' dtype: q converts exactly to bf16 or
fp32 (e4m3 has 3 mantissa bits), so only the summation order separates the kernel from this twin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q in e4m3 of weight's shape, scale [...] fp32, one per output row)."""
    w = weight.float()
    amax = w.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight the FP8 values stand for, in `dtype`."""
    return (q.float() * scale[..., None]).to(dtype)


def fp8_linear_reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ (q [N, K] * scale [N]).T (+ bias), accumulated in fp32, in x's dtype."""
    y = F.linear(x.float(), q.float()) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
