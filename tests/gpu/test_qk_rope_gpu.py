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


def _count_launches(monkeypatch) -> list[bool]:
    """One entry a q/k launch: whether it also wrote the cache (its `kv` argument)."""
    launches = []
    launch = triton_qk_rope.launch

    def counting(*args, **kwargs):
        launches.append((args[8] if len(args) > 8 else kwargs.get("kv")) is not None)
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


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("tokens", [1, 40, 300])
def test_the_launch_that_writes_the_cache_writes_what_write_kv_would(
    fp8: bool, tokens: int
) -> None:
    """Qwen3-8B's heads in bf16: the op's output, and the cache (an FP8 cache in the engine's
    layouts) holding write_kv's bytes and scales from that output's keys and qkv's values; a
    padded token's slot (-1) untouched."""
    from rollout.kernels import torch_paged_attention as twin
    from rollout.kernels import triton_paged_attention
    from rollout.kernels.torch_fp8 import FP8_DTYPE

    g = torch.Generator(device="cuda").manual_seed(tokens)
    num_q, num_kv, head_dim, page = 32, 8, 128, 32 if fp8 else 16
    qkv = torch.randn(tokens, (num_q + 2 * num_kv) * head_dim, device="cuda", generator=g)
    qkv[tokens // 2] *= 50
    weights = 1 + torch.randn(2, head_dim, device="cuda", generator=g) / 4
    angles = torch.rand(tokens, head_dim, device="cuda", generator=g) * 1000
    qkv, weights, cos, sin = (t.bfloat16() for t in (qkv, weights, angles.cos(), angles.sin()))
    args = (qkv, weights[0], weights[1], 1e-6, cos, sin, num_q, num_kv)
    blocks = tokens // page + 2
    slots = torch.randperm(blocks * page, device="cuda", generator=g)[:tokens]
    if tokens > 1:  # one token left: it is written
        slots[tokens // 3] = -1
    dtype = FP8_DTYPE if fp8 else torch.bfloat16
    caches = [
        torch.zeros(blocks, page, num_kv, head_dim, dtype=dtype, device="cuda") for _ in range(4)
    ]
    scales = [None] * 4
    if fp8:  # the engine's layouts
        layouts = [twin.keys_by_head, twin.v_by_token] * 2
        caches = [layout(c) for layout, c in zip(layouts, caches, strict=True)]
        scales = [
            twin.scales_by_head(torch.ones(blocks, page, num_kv, device="cuda")) for _ in range(4)
        ]
    kv = triton_qk_rope.KVWrite(caches[0], caches[1], slots, scales[0], scales[1])
    got = triton_qk_rope.norm_rope_writing_kv(*args, kv)
    want = torch.ops.rollout.qk_norm_rope(*args)
    assert got is not None and torch.equal(got, want)
    key = want[:, num_q:]
    value = qkv[:, (num_q + num_kv) * head_dim :].reshape(tokens, num_kv, head_dim)
    triton_paged_attention.write_kv(key, value, caches[2], caches[3], slots, scales[2], scales[3])
    for a, b in ((0, 2), (1, 3)):
        assert torch.equal(caches[a].view(torch.uint8), caches[b].view(torch.uint8))
        if fp8:
            assert torch.equal(scales[a], scales[b])


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_engine_writing_the_cache_in_the_qk_launch_equals_write_kv(
    kv_cache_dtype: str, monkeypatch
) -> None:
    """A compiled bf16 engine with CUDA graphs, sampling: the same tokens whether the q/k launch
    writes the keys and values or the op leaves them to `write_kv` (the kernel made to decline)."""
    model = tiny_model("qwen3").to("cuda", torch.bfloat16)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    settings = dict(
        dtype="bfloat16", num_kv_blocks=200, compile_model=True, kv_cache_dtype=kv_cache_dtype
    )
    launches = _count_launches(monkeypatch)
    fused = engine_for(model, ON_GPU, **settings).generate(PROMPTS, sampled)
    assert any(launches), "the steps must write the cache in the q/k launch"
    monkeypatch.setattr(triton_qk_rope, "norm_rope_writing_kv", lambda *args: None)
    apart = engine_for(model, ON_GPU, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in fused] == [r.token_ids for r in apart]
