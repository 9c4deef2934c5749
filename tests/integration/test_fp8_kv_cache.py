"""The FP8 KV cache (`EngineConfig(kv_cache_dtype="fp8")`, fp32 on CPU): the engine serves
exactly the model whose attention sees FP8-rounded keys and values, through chunked prefill,
preemption and recompute, forks of a group's prompt and the prefix cache; and the pool holds
1.9x the tokens in the same memory."""

from __future__ import annotations

import pytest
import torch

from rollout import EngineConfig, SamplingParams
from rollout.engine.execution.kv_cache import KVCacheShape
from rollout.kernels.torch_fp8 import FP8_DTYPE
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model
from tests.fp8_oracle import rounded_copy, with_fp8_kv_attention

PREEMPTING = dict(
    block_size=4,
    max_model_len=128,
    max_num_seqs=8,
    max_num_batched_tokens=12,  # chunked prefill, mixed steps
    num_kv_blocks=24,  # forces preemption
    device="cpu",
    dtype="float32",
    kv_cache_dtype="fp8",
)
PROMPT_LENGTHS = (1, 3, 4, 5, 9, 17, 30)
MAX_NEW = 24


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_greedy_equals_transformers_with_fp8_rounded_keys_and_values(arch, overlap) -> None:
    model = tiny_model(arch, seed=2)
    reference = with_fp8_kv_attention(model)
    prompts = random_prompts(PROMPT_LENGTHS, seed=1)
    expected = [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    assert expected != [hf_greedy(model, p, MAX_NEW) for p in prompts], "the rounding shows"
    engine = engine_for(model, PREEMPTING, overlap=overlap)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0
    cache = engine.debug_internals().runner.kv_caches[0]
    assert cache.k.dtype == FP8_DTYPE and cache.k_scale is not None


def test_the_default_pages_of_32_tokens_stay_exact_through_preemption() -> None:
    """block_size left unset: an FP8 cache's pages of 32 tokens (tiles of the crowded decode
    read one page each), through chunked prefill, preemption and recompute."""
    model = tiny_model("llama")
    reference = with_fp8_kv_attention(model)
    prompts = random_prompts((1, 5, 16, 17, 33, 50, 64, 9, 2), seed=21)
    expected = [hf_greedy(reference, p, 40) for p in prompts]
    settings = dict(PREEMPTING, block_size=None, max_model_len=256, max_num_seqs=16)
    engine = engine_for(model, settings, max_num_batched_tokens=48, num_kv_blocks=10)
    assert engine.config.block_size == 32
    results = engine.generate(prompts, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0


def test_sampled_logprobs_and_forks_share_the_prompts_fp8_blocks() -> None:
    model = tiny_model("qwen3", seed=3)
    reference = with_fp8_kv_attention(model)
    prompt = random_prompts((13,), seed=5)[0]
    engine = engine_for(model, PREEMPTING, num_kv_blocks=64)
    params = SamplingParams(max_tokens=16, temperature=1.0, n=4, seed=7)
    for r in engine.generate([prompt], params):  # four samples forked from one prompt's blocks
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + r.token_ids])).logits[0].float()
        logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        want = logprobs.gather(1, torch.tensor(r.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(r.logprobs), want, rtol=1e-5, atol=1e-5)


def test_a_cached_prefix_is_reused_from_the_fp8_cache() -> None:
    model = tiny_model("llama", seed=4)
    reference = with_fp8_kv_attention(model)
    engine = engine_for(model, PREEMPTING, num_kv_blocks=64, enable_prefix_caching=True)
    system = random_prompts((16,), seed=6)[0]
    first, second = (system + tail for tail in random_prompts((3, 5), seed=7))
    greedy = SamplingParams(max_tokens=12, temperature=0)
    engine.generate([first], greedy)
    [again] = engine.generate([second], greedy)
    assert engine.stats().prefix_hit_tokens >= 16  # the system prompt's blocks, with their scales
    assert again.token_ids == hf_greedy(reference, second, 12)


def test_fp8_weights_and_fp8_kv_together() -> None:
    model = tiny_model("qwen3_moe", seed=5)
    reference = with_fp8_kv_attention(rounded_copy(model))
    prompts = random_prompts((4, 11, 19), seed=8)
    engine = engine_for(model, PREEMPTING, weight_quantization="fp8")
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]


def test_the_pool_holds_about_twice_the_tokens() -> None:
    shape = KVCacheShape(num_layers=36, num_kv_heads=8, head_dim=128)
    bf16 = shape.bytes_per_block(16, torch.bfloat16)
    fp8 = shape.bytes_per_block(16, FP8_DTYPE)
    assert fp8 == 2 * 36 * 16 * 8 * (128 + 4) and bf16 / fp8 == pytest.approx(1.94, abs=0.01)


def test_an_unknown_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="int8")
