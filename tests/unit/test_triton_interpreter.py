"""The Triton kernels' logic on CPU, through Triton's interpreter (the GPU tests check speed-free
numerics on the device; this keeps CI able to catch a broken kernel without one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_match_twins_in_the_interpreter() -> None:
    # The interpreter is chosen when kernels are defined, so it needs a fresh process.
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "tests.triton_interpreter_check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "decode:" in result.stdout and "extend:" in result.stdout
