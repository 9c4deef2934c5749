"""The integer widening of e4m3 to bf16 (`triton_fp8_widen._WIDEN_BF16`, inline PTX the CPU
cannot run) executed here by a small interpreter of the instructions it uses, for every e4m3
byte in every position of its register: it must give the cast's bits (the GPU tests check the
compiled kernels the same way, on the device)."""

from __future__ import annotations

import re

import torch

from rollout.kernels.torch_fp8 import FP8_DTYPE
from rollout.kernels.triton_fp8_widen import _WIDEN_BF16

MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32, generic form: byte i of the result is byte (nibble i & 7) of {b, a}, or
    that byte's sign copied over 8 bits where the nibble's top bit is set."""
    source = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        byte = source[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _bf16x2_fma(a: int, b: int, c: int) -> int:
    def lanes(x: int) -> torch.Tensor:
        return (
            torch.tensor([x & 0xFFFF, x >> 16], dtype=torch.int32)
            .to(torch.int16)
            .view(torch.bfloat16)
        )

    # products of a bf16 and a power of two are exact: one rounding, to bf16, as fma.rn's
    out = (lanes(a).double() * lanes(b).double() + lanes(c).double()).to(torch.bfloat16)
    bits = out.view(torch.int16).to(torch.int32) & 0xFFFF
    return int(bits[0]) | int(bits[1]) << 16


def _run(program: str, operand: int) -> tuple[int, int]:
    """Execute the asm block for one input register ($2); returns ($0, $1)."""
    registers: dict[str, int] = {"$2": operand}

    def value(token: str) -> int:
        token = token.strip()
        return registers[token] if token in registers else int(token, 0)

    for line in program.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dest, *rest = [a.strip() for a in args.split(",")]
        if op == "mov.b32":
            registers[dest] = value(rest[0])
        elif op == "prmt.b32":
            registers[dest] = _prmt(value(rest[0]), value(rest[1]), value(rest[2]))
        elif op == "shl.b32":
            registers[dest] = (value(rest[0]) << value(rest[1])) & MASK
        elif op == "shr.b32":
            registers[dest] = value(rest[0]) >> value(rest[1])
        elif op == "and.b32":
            registers[dest] = value(rest[0]) & value(rest[1])
        elif op == "or.b32":
            registers[dest] = value(rest[0]) | value(rest[1])
        elif op == "fma.rn.bf16x2":
            registers[dest] = _bf16x2_fma(*(value(r) for r in rest))
        else:
            raise AssertionError(f"the test's interpreter does not know {op!r}: extend it")
    return registers["$0"], registers["$1"]


def test_the_integer_widening_is_the_cast_for_every_byte_in_every_position() -> None:
    program = str(_WIDEN_BF16.value if hasattr(_WIDEN_BF16, "value") else _WIDEN_BF16)
    assert re.search(r"prmt\.b32", program)
    codes = torch.arange(256, dtype=torch.int32)
    want = codes.to(torch.uint8).view(FP8_DTYPE).to(torch.bfloat16)
    # e4m3's NaN (0x7F, 0xFF) reads as +-480, by the code's sign bit (module docstring)
    nan_as = torch.where(codes >= 0x80, -480.0, 480.0)
    want = torch.where(want.isnan(), nan_as, want.float())
    want_bits = want.bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF
    for code in range(256):
        for position in range(4):  # the byte's place in the register, the others random
            others = torch.randint(0, 256, (4,), generator=torch.Generator().manual_seed(code))
            register = sum(int(b) << (8 * i) for i, b in enumerate(others))
            register = (register & ~(0xFF << (8 * position))) | (code << (8 * position))
            lo, hi = _run(program, register)
            lane = (lo, lo >> 16, hi, hi >> 16)[position] & 0xFFFF
            assert lane == int(want_bits[code]), (hex(code), position, hex(lane))
