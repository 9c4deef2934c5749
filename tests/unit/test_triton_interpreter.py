"""The Triton kernels' logic on CPU, through Triton's interpreter (the GPU tests check speed-free
numerics on the device; this keeps CI able to catch a broken kernel without one), and every
launch the interpreter made compiled for an H200 by Triton's front end (what the interpreter
cannot refuse: tests/triton_launches.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_match_twins_in_the_interpreter_and_compile_for_the_gpu(tmp_path) -> None:
    # The interpreter is chosen when kernels are defined, so it needs a fresh process.
    launches = tmp_path / "launches.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "ROLLOUT_TRITON_LAUNCHES": str(launches)}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "tests.triton_interpreter_check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "decode:" in result.stdout and "extend:" in result.stdout
    kernels = {launch["kernel"] for launch in json.loads(launches.read_text())}
    assert {
        "_decode_kernel",
        "_extend_kernel",
        "_down_kernel",
        "_sample_slice_kernel",
        "_rms_norm_rounded_kernel",
        "_silu_mul_rounded_kernel",
        "_round_rows_kernel",
        "_qk_norm_rope_kernel",
        "_gate_up_silu_kernel",
        "_round_by_parts_kernel",
    } <= kernels

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    compiled = subprocess.run(
        [sys.executable, "-m", "tests.triton_launches", str(launches), "--sass"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert "distinct launches for sm_90" in compiled.stdout
    assert "bf16 twins of the FP8 launches to sm_90 cubins" in compiled.stdout
    # the roundings to FP8 compiled with the GPU's own e4m3 conversion too, and q/k's norms
    # and rotary with bf16's roundings
    for kernel in ("_rms_norm_rounded_kernel", "_silu_mul_rounded_kernel", "_round_rows_kernel",
                   "_qk_norm_rope_kernel", "_gate_up_silu_kernel", "_round_by_parts_kernel"):  # fmt: skip
        assert f"\n{kernel} " in compiled.stdout, kernel
    # --sass: each twin's largest loops counted in its cubin (the FP8 decode read's tile loop,
    # one of them, has K's conversions in it)
    decode_loops = [
        line for line in compiled.stdout.splitlines()
        if line.startswith("_decode_kernel") and "'KEYS_WIDE': True" in line
    ]  # fmt: skip
    assert decode_loops and all("F2FP" in line for line in decode_loops)


def test_loops_are_backward_branches_largest_first() -> None:
    from tests.triton_launches import loops

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDS R2, [R1] ;
        /*0020*/                   FADD R2, R2, R2 ;
        /*0030*/              @!P0 BRA 0x10 ;
        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0050*/                   F2FP.F16.E4M3.UNPACK_B R8, R9 ;
        /*0060*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0070*/                   ISETP.GE.AND P0, PT, R3, 0x8, PT ;
        /*0080*/              @!P0 BRA 0x40 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   BRA 0xa0 ;
    """
    found = loops(sass)
    assert [[line.split()[0] for line in body] for body in found] == [
        ["HMMA.16816.F32", "F2FP.F16.E4M3.UNPACK_B", "IADD3", "ISETP.GE.AND", "@!P0"],
        ["LDS", "FADD", "@!P0"],
    ]  # fmt: skip
    assert loops("/*0000*/ EXIT ;") == []
