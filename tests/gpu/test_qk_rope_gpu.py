"""Qwen3's q/k norms and rotary in one Triton launch on the GPU: the kernel against its twin in
every activation dtype, and the engine through it equal to transformers (fp32 greedy), with
CUDA graphs equal to eager in a compiled bf16 engine."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from rollout.kernels import torch_qk_rope, triton_qk_rope
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model

pytestmark = pytest.mark.gpu

PROMPTS = random_prompts((1, 5, 16, 17, 33, 50, 64, 9, 2), seed=23)
ON_GPU = dict(
    device="cuda",
    dtype="float32",
    block_size=16,
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=48,
    num_kv_blocks=24,  # preemption
    attention="triton",
    compile_model=False,
)
# The largest |kernel - twin| a dtype allows, relative to the head's largest output: the
# kernel's fp32 sum of squares and rsqrt may move the normed values' rounding by a step of the
# dtype, which the rotation mixes into both halves.
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4 * 2.0**-10, torch.bfloat16: 4 * 2.0**-7}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 40, 300])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_kernel_equals_its_twin(dtype: torch.dtype, tokens: int, head_dim: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(tokens + head_dim)
    num_q, num_kv = 32, 8  # Qwen3-8B's heads
    qkv = torch.randn(1, tokens, (num_q + 2 * num_kv) * head_dim, device="cuda", generator=g)
    qkv[0, tokens // 2] *= 50
    weights = 1 + torch.randn(2, head_dim, device="cuda", generator=g) / 4
    angles = torch.rand(1, tokens, head_dim, device="cuda", generator=g) * 1000
    qkv, weights, cos, sin = (t.to(dtype) for t in (qkv, weights, angles.cos(), angles.sin()))
    args = (qkv, weights[0], weights[1], 1e-6, cos, sin, num_q, num_kv)
    got = torch.ops.rollout.qk_norm_rope(*args)
    want = torch_qk_rope.qk_norm_rope(*args)
    assert got.shape == want.shape == (1, tokens, num_q + num_kv, head_dim)
    assert got.dtype == dtype
    head_scale = want.float().abs().amax(-1, keepdim=True)
    assert ((got.float() - want.float()).abs() <= RELATIVE_TOLERANCE[dtype] * head_scale).all()
    if dtype != torch.float32:  # the roundings are transformers': almost every value is its own
        assert (got == want).float().mean() > 0.99


def _count_launches(monkeypatch) -> list[int]:
    launches = []
    launch = triton_qk_rope.launch

    def counting(*args, **kwargs):
        launches.append(1)
        return launch(*args, **kwargs)

    monkeypatch.setattr(triton_qk_rope, "launch", counting)
    return launches


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_fp32_greedy_through_the_kernel_equals_transformers(arch: str, monkeypatch) -> None:
    model = tiny_model(arch).to("cuda")
    expected = [hf_greedy(model, p, 40) for p in PROMPTS]
    launches = _count_launches(monkeypatch)
    engine = engine_for(model, ON_GPU)
    assert all(layer.self_attn._qk_rope for layer in engine.model.model.layers)
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert launches, "the steps must run the q/k norm and rotary kernel"
    assert engine.stats().preemptions > 0 and engine.stats().cuda_graphs > 0


def test_compiled_bf16_graphs_equal_eager_and_agree_with_the_modules() -> None:
    model = tiny_model("qwen3").to("cuda", torch.bfloat16)
    settings = dict(dtype="bfloat16", num_kv_blocks=200, compile_model=True)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    graphed = engine_for(model, ON_GPU, **settings)
    a = graphed.generate(PROMPTS, sampled)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]

    greedy = SamplingParams(max_tokens=32, temperature=0)
    routed = engine_for(model, ON_GPU, **settings).generate(PROMPTS, greedy)
    own = engine_for(model, ON_GPU, fused_qk_rope=False, **settings).generate(PROMPTS, greedy)
    assert [r.token_ids[:2] for r in routed] == [r.token_ids[:2] for r in own]
    same = sum(
        x == y
        for r, o in zip(routed, own, strict=True)
        for x, y in zip(r.token_ids, o.token_ids, strict=True)
    )
    assert same / sum(len(r.token_ids) for r in own) > 0.8  # bf16: a near-tie may flip
