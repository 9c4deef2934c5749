"""The PyTorch twins of the kernels that round their outputs for FP8 activations
(`triton_rounded_rows`), and what the engine runs off the GPU: a Llama-family layer's residual
add and RMSNorm, and its MLP's silu(gate) * up, as transformers computes them, with the result
rounded as a projection's input is rounded (`torch_fp8.quantize_rows` / `quantize_groups`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rollout.kernels.torch_fp8 import (
    dequantize_groups,
    dequantize_rows,
    quantize_groups,
    quantize_rows,
)


def rounded(y: torch.Tensor, grouped: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y rounded in its dtype, q, scale): with a scale per row, or per 128 inputs of a row."""
    q, scale = quantize_groups(y) if grouped else quantize_rows(y)
    return (dequantize_groups if grouped else dequantize_rows)(q, scale, y.dtype), q, scale


def rms_norm_rounded(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    grouped: bool,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, q, scale): h = residual + x (x without a residual), y = RMSNorm(h) * weight
    rounded, in y's dtype (exact), and its FP8 form q, scale: y == dequantize(q, scale)."""
    h = x if residual is None else residual + x
    hidden = h.float()
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return h, *rounded(weight * (hidden * torch.rsqrt(variance + eps)).to(h.dtype), grouped)


def silu_mul_rounded(
    gate_up: torch.Tensor, grouped: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, q, scale): y = silu(gate) * up for gate_up = [gate | up] along its last dim,
    rounded, and its FP8 form."""
    gate, up = gate_up.chunk(2, dim=-1)
    return rounded(F.silu(gate) * up, grouped)
