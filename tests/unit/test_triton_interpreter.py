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
    assert {"_decode_kernel", "_extend_kernel", "_down_kernel", "_sample_slice_kernel"} <= kernels

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    compiled = subprocess.run(
        [sys.executable, "-m", "tests.triton_launches", str(launches)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert "distinct launches for sm_90" in compiled.stdout
    assert "bf16 twins of the FP8 launches to sm_90 cubins" in compiled.stdout
