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


def pow2_scales(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two s with amax / s <= 448, per element (1 where amax is 0), from the
    float's bits alone (no division or log: the Triton KV write computes the very same): with
    amax = m x 2^E, m in [1, 2), and 448 = 1.75 x 2^8, s = 2^(E - 8) when m <= 1.75, else 2^(E - 7)."""
    bits = amax.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    mantissa = bits & 0x7FFFFF
    k = exponent - 8 + (mantissa > 0x600000).int()
    scale = ((k.clamp(min=-126) + 127) << 23).view(torch.float32)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def row_scales(weight: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale of each output row (fp32, weight's shape without its last dim)."""
    return pow2_scales(weight.detach().abs().amax(dim=-1).float())


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q in e4m3 of weight's shape, scale [...] fp32, one per output row)."""
    scale = row_scales(weight)
    q = (weight.detach().float() / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


ACTIVATION_GROUP = 128
"""activation_quantization="fp8-group": a scale per this many consecutive inputs of a row (the
FP8 MMA GEMM's K tile, so each tile's products take one scale a row)."""


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q in e4m3 of x's shape, scale [..., ceil(K / ACTIVATION_GROUP)] fp32): each run of
    ACTIVATION_GROUP consecutive elements of a row (the last may be shorter) rounded with a
    power-of-two scale of its own, by `quantize_rows`' rule. A row's outliers then coarsen only
    their own group, not the whole row."""
    k = x.shape[-1]
    groups = -(-k // ACTIVATION_GROUP)
    padded = F.pad(x, (0, groups * ACTIVATION_GROUP - k)) if k % ACTIVATION_GROUP else x
    q, scale = quantize_rows(padded.reshape(*x.shape[:-1], groups, ACTIVATION_GROUP))
    return q.reshape(*x.shape[:-1], groups * ACTIVATION_GROUP)[..., :k], scale


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values `quantize_groups`' output stands for, in `dtype` (exact in bf16). In the same
    [..., groups, ACTIVATION_GROUP] view as the rounding, so that torch.compile makes one kernel
    of both."""
    k, groups = q.shape[-1], scale.shape[-1]
    if groups != -(-k // ACTIVATION_GROUP):
        raise ValueError(
            f"dequantize_groups: {groups} scales a row for {k} elements; groups of "
            f"{ACTIVATION_GROUP} need {-(-k // ACTIVATION_GROUP)}"
        )
    padded = q.float()
    if k % ACTIVATION_GROUP:
        padded = F.pad(padded, (0, groups * ACTIVATION_GROUP - k))
    tiles = padded.reshape(*q.shape[:-1], groups, ACTIVATION_GROUP) * scale[..., None]
    return tiles.reshape(*q.shape[:-1], groups * ACTIVATION_GROUP)[..., :k].to(dtype)


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys or values [..., head_dim] in e4m3 with a power-of-two scale per (token, head): what
    the FP8 KV cache stores (the scale from `pow2_scales`, the rows multiplied by its exact
    inverse), and its twin's oracle."""
    scale = pow2_scales(x.detach().abs().amax(dim=-1).float())
    inverse = pow2_inverse(scale)
    q = (x.float() * inverse[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def pow2_inverse(scale: torch.Tensor) -> torch.Tensor:
    """1 / scale for powers of two, exactly (a multiply by it is exact where a divide need not be
    in a kernel)."""
    bits = scale.view(torch.int32)
    return ((254 << 23) - bits).view(torch.float32)


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
