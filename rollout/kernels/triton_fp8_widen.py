"""e4m3 widened to bf16 inside the kernels that read FP8 (the decode GEMM, the MoE experts, the
KV cache), with integer ops and one bf16 multiply per two values instead of Triton's own cast.

Triton lowers `x.to(tl.bfloat16)` of an e4m3 tensor to the GPU's conversion instructions, one
F2FP (e4m3x2 to f16x2) per two values and one F2F (f16 to bf16) per value in the compiled
decode GEMM, which Hopper issues at 16 per clock and SM, a quarter of its 32-bit integer rate
(CUDA C++ Programming Guide, arithmetic instruction throughput); a decode GEMM or attention tile
widens every byte it reads, so those conversions, not the memory, set its speed. Here each 32-bit register of four
e4m3 bytes becomes two registers of bf16 pairs:

- each byte is moved to the low half of a 16-bit lane with its sign copied over the high half
  (`prmt`'s sign mode), and the lane shifted up by 4 and masked (`and` with 0x87F0): the sign
  lands on bf16's sign bit, the 7 exponent-and-mantissa bits on bf16's exponent's low 4 bits and
  mantissa's top 3, everything else is cleared: the bf16 whose exponent field is e4m3's, i.e.
  the value times 2^-120 exactly (e4m3's bias is 7, bf16's 127), subnormals included (both
  formats' subnormals scale alike). Three integer instructions a register of two values (the
  byte moved to the lane's high half, then its sign and the rest apart, took four);
- one bf16x2 fused multiply by 2^120 (plus -0, so signed zeros stay) restores the value; bf16
  arithmetic keeps subnormal inputs, and every product is a normal bf16 of at most 448.

So the result equals the cast for every finite e4m3 value. The one difference: e4m3's NaN
(0x7F/0xFF) reads as +-480. FP8 weights never hold it (`fp8_weights` refuses non-finite weights),
and a NaN written to the KV cache comes from a forward whose own logits were already NaN.

Under Triton's interpreter (CPU) and for fp16/fp32 activations the kernels keep the cast. The
K tiles of an FP8 cache widen to fp16 under bf16 activations instead
(`triton_attention_tiles.fp16_keys`): that takes one conversion a pair and no integer work.
"""

from __future__ import annotations

import torch

from rollout.kernels.gpu_features import compiled_on_nvidia
from rollout.kernels.triton_import import tl, triton

FAST_WIDEN = True
"""Widen with `widen_e4m3`'s integer path where it applies; benchmarks set False to time the cast."""

_WIDEN_BF16 = tl.constexpr(
    """
    {
    .reg .b32 lo, hi, two120, negzero;
    mov.b32 two120, 0x7B807B80;
    mov.b32 negzero, 0x80008000;
    prmt.b32 lo, $2, 0, 0x9180;
    prmt.b32 hi, $2, 0, 0xB3A2;
    shl.b32 lo, lo, 4;
    shl.b32 hi, hi, 4;
    and.b32 lo, lo, 0x87F087F0;
    and.b32 hi, hi, 0x87F087F0;
    fma.rn.bf16x2 $0, lo, two120, negzero;
    fma.rn.bf16x2 $1, hi, two120, negzero;
    }
    """
)


# fp16 needs no integer path: the GPU's own conversion (one F2FP per two values) gives fp16
# directly, with no second conversion. Written out so that the attention tiles can keep it
# where the tile is loaded (`WHERE_LOADED`), as the cast cannot be.
_WIDEN_F16 = tl.constexpr(
    """
    {
    .reg .b16 lo, hi;
    mov.b32 {lo, hi}, $2;
    cvt.rn.f16x2.e4m3x2 $0, lo;
    cvt.rn.f16x2.e4m3x2 $1, hi;
    }
    """
)


@triton.jit
def widen_e4m3(x, dtype: tl.constexpr, FAST: tl.constexpr, WHERE_LOADED: tl.constexpr):
    """The e4m3 tensor `x` in `dtype`, exactly; FAST (bf16 or fp16, compiled for an NVIDIA GPU):
    bf16 through the integer path above (`prmt` lanes: bytes 0 and 1 of each register into the
    first output register's low and high halves, bytes 2 and 3 into the second's), fp16 through
    the conversion instruction (NaN stays NaN there).

    WHERE_LOADED keeps the widening where it is written (not pure): the tile is widened in the
    layout it was loaded in and handed to the MMA in bf16 through shared memory once more,
    where `ldmatrix` transposes the operands that need it. The attention kernels' V tile needs
    that: widened in the MMA's operand layout instead, its transposed operand is read from
    shared memory one byte at a time. Otherwise (pure) Triton moves the widening past the
    shared-memory load into the operand layout: no second trip through shared memory, and in
    the decode GEMM half the registers (72 a thread against 136, compiled for sm_90)."""
    if FAST and dtype == tl.float16:
        return tl.inline_asm_elementwise(
            _WIDEN_F16, "=r,=r,r", [x.to(tl.uint8, bitcast=True)],
            dtype=tl.float16, is_pure=not WHERE_LOADED, pack=4,
        )  # fmt: skip
    elif FAST:
        return tl.inline_asm_elementwise(
            _WIDEN_BF16, "=r,=r,r", [x.to(tl.uint8, bitcast=True)],
            dtype=tl.bfloat16, is_pure=not WHERE_LOADED, pack=4,
        )  # fmt: skip
    else:
        return x.to(dtype)


def fast_widen(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a launch for activations of `dtype` on `device` widens through the integer path."""
    return FAST_WIDEN and dtype == torch.bfloat16 and compiled_on_nvidia(device)
