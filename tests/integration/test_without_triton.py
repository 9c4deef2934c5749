"""The engine and the job on a machine without Triton (the CPU build of torch does not bring it):
everything imports, and the engine computes on CPU what it computes with Triton installed.

The test suite's own environment has Triton (its interpreter tests need it), so a fresh process
is made to see none: `import triton` fails there as where it is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model

ROOT = Path(__file__).resolve().parents[2]
MAX_NEW = 8
SETTINGS = dict(
    block_size=4, max_model_len=64, max_num_seqs=4, num_kv_blocks=32, device="cpu",
    dtype="float32",
)  # fmt: skip
# FP8 settings whose ops (the roundings, q/k norms and rotary, the experts, the routing) are
# defined beside their Triton kernels; an MoE model takes no FP8 activations
FP8_WEIGHTS_KV_HEAD = dict(weight_quantization="fp8", kv_cache_dtype="fp8", fp8_lm_head=True)
FP8 = {
    "qwen3": dict(FP8_WEIGHTS_KV_HEAD, activation_quantization="fp8", fp8_lm_head_input=True),
    "qwen3_moe": FP8_WEIGHTS_KV_HEAD,
}
ARCHS = ("qwen3", "qwen3_moe")

_SCRIPT = f"""
import json, sys
sys.modules["triton"] = None  # `import triton` now raises ImportError
sys.modules["triton.language"] = None
import trainers.job.run, rollout.actors.pool  # the job's own import path
from rollout import SamplingParams
from rollout.kernels.triton_import import HAS_TRITON
from rollout.kernels import triton_rounded_rows
from tests.conftest import engine_for, random_prompts, tiny_model
from tests.integration.test_without_triton import ARCHS, FP8, MAX_NEW, SETTINGS

assert not HAS_TRITON
try:
    triton_rounded_rows._round_rows_kernel[(1,)]()
    launch_error = None
except RuntimeError as error:
    launch_error = str(error)
tokens = {{}}
for arch in ARCHS:
    model = tiny_model(arch, seed=3)
    for name, case in (("plain", {{}}), ("fp8", FP8[arch])):
        engine = engine_for(model, SETTINGS, **case)
        out = engine.generate(random_prompts([5, 9], seed=1), SamplingParams(max_tokens={MAX_NEW}, temperature=0))
        tokens[f"{{arch}}/{{name}}"] = [r.token_ids for r in out]
print(json.dumps({{"tokens": tokens, "launch_error": launch_error}}))
"""


@pytest.fixture(scope="module")
def without_triton() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_engine_without_triton_is_generate_exactly(without_triton, arch) -> None:
    model = tiny_model(arch, seed=3)
    want = [hf_greedy(model, p, MAX_NEW) for p in random_prompts([5, 9], seed=1)]
    assert without_triton["tokens"][f"{arch}/plain"] == want


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_without_triton_computes_what_it_does_with_triton_installed(
    without_triton, arch
) -> None:
    engine = engine_for(tiny_model(arch, seed=3), SETTINGS, **FP8[arch])
    out = engine.generate(random_prompts([5, 9], seed=1), _greedy())
    assert without_triton["tokens"][f"{arch}/fp8"] == [r.token_ids for r in out]


def test_a_kernel_launched_without_triton_says_to_install_it(without_triton) -> None:
    assert "_round_rows_kernel" in without_triton["launch_error"]
    assert "pip install triton" in without_triton["launch_error"]


def _greedy():
    from rollout import SamplingParams

    return SamplingParams(max_tokens=MAX_NEW, temperature=0)
