"""e4m3 rounding inside the kernels that write or compute in FP8 (the KV write, the GEMM over FP8
activations): the power-of-two scale of a group of values, and the e4m3 byte of a value, both as
the PyTorch side computes them (`torch_fp8.pow2_scales`, torch's cast)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pow2_scale(amax):
    """`torch_fp8.pow2_scales` and its exact inverse, from amax's bits: the smallest power of
    two s with amax / s <= 448 (1 where amax is 0)."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    mantissa = bits & 0x7FFFFF
    k = tl.maximum(exponent - 8 + (mantissa > 0x600000).to(tl.int32), -126)
    scale = ((k + 127) << 23).to(tl.float32, bitcast=True)
    scale = tl.where(amax > 0, scale, 1.0)
    inverse = ((254 << 23) - scale.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit
def e4m3_bits(x):
    """The e4m3 byte of each fp32 value in [-448, 448], rounded to nearest even, from its bits
    (as torch's cast and the GPU's cvt.rn round; written out so that every backend, Triton's
    CPU interpreter included, stores the same bytes)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    exponent = (magnitude >> 23) - 127
    mantissa = magnitude & 0x7FFFFF
    # Normal (|x| >= 2^-6): keep 3 mantissa bits; a carry out of them raises the exponent.
    kept = mantissa >> 20
    rest = mantissa & 0xFFFFF
    up = (rest > 0x80000) | ((rest == 0x80000) & ((kept & 1) == 1))
    normal = ((exponent + 7) << 3) + kept + up.to(tl.int32)
    # Subnormal (|x| < 2^-6): the value in steps of 2^-9, rounded half to even (8 is the
    # smallest normal's code, so a carry needs nothing more).
    steps = tl.abs(x) * 512.0
    whole = tl.floor(steps)
    half_up = (steps - whole > 0.5) | ((steps - whole == 0.5) & (whole % 2 == 1))
    subnormal = (whole + half_up.to(tl.float32)).to(tl.int32)
    code = tl.where(exponent >= -6, normal, subnormal)
    return (sign | code).to(tl.uint8)
