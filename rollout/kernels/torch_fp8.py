"""FP8 weights: e4m3 values with one power-of-two scale per output row, and the PyTorch twin of
the FP8 GEMM (the oracle of its tests).

A weight [..., N, K] is stored as q = round_e4m3(w / s) where s is the smallest power of two with
amax(row) / s <= 448 (the largest e4m3 value): each row's largest value lands in (224, 448], the
format's top binade, and a row of zeros gets s = 1. A power of two, because then q * s is exact
in bf16 and fp32 (e4m3 has 3 mantissa bits, bf16 7, and the exponent only shifts): the engine can
keep the weight itself as those exact values for its prefill GEMMs while its decode GEMMs read the
FP8 bytes, and both compute the same model. Rounding that model again gives the same weight
(`round_to_fp8_` is idempotent on it), so a weight sync that leaves a tensor alone leaves it alone.

The GEMM computes y = s * (x @ q.T) in fp32 and rounds once to the activations' dtype; the
products x * q * s are those of x @ (q * s).T exactly, so only the summation order separates the
kernel from F.linear over the dequantized weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448


def row_scales(weight: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale of each output row (fp32, weight's shape without its last dim)."""
    need = weight.detach().abs().amax(dim=-1).float() / FP8_MAX
    mantissa, exponent = torch.frexp(need)  # need = mantissa * 2^exponent, mantissa in [0.5, 1)
    exponent = exponent - (mantissa == 0.5).int()  # an exact power of two is its own scale
    scale = torch.ldexp(torch.ones_like(need), exponent)
    return torch.where(need > 0, scale, torch.ones_like(need))


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q in e4m3 of weight's shape, scale [...] fp32, one per output row)."""
    scale = row_scales(weight)
    q = (weight.detach().float() / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight the FP8 values stand for, in `dtype` (exact in bf16, fp16 within range, fp32)."""
    return (q.float() * scale[..., None]).to(dtype)


@torch.no_grad()
def round_to_fp8_(weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """Quantize `weight` into `q` and `scale`, and overwrite `weight` with the values they stand
    for, all in place (CUDA graphs keep reading the same storage). One row block at a time, so the
    fp32 temporaries stay small beside a large expert tensor."""
    rows = weight.reshape(-1, weight.shape[-1])
    q_rows, s_rows = q.view(-1, q.shape[-1]), scale.view(-1)
    step = max(1, (1 << 26) // max(1, rows.shape[-1]))  # 64M elements of fp32 at most
    for start in range(0, rows.shape[0], step):
        block = rows[start : start + step]
        q_block, s_block = quantize_rows(block)
        q_rows[start : start + step].copy_(q_block)
        s_rows[start : start + step].copy_(s_block)
        block.copy_(dequantize_rows(q_block, s_block, block.dtype))


def fp8_linear_reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ (q [N, K] * scale [N]).T (+ bias), accumulated in fp32, in x's dtype."""
    y = F.linear(x.float(), q.float()) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
