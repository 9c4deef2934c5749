"""The engine against transformers itself: greedy tokens and logprobs (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from tests.conftest import EOS, engine_for, hf_greedy, random_prompts, tiny_model

# Mixed lengths around the block size (4), one longer than the token budget (chunked prefill).
PROMPT_LENGTHS = (1, 3, 4, 5, 9, 17, 30)
MAX_NEW = 24


PREEMPTING = dict(
    block_size=4,
    max_model_len=128,
    max_num_seqs=8,
    max_num_batched_tokens=12,  # < the longest prompt: chunked prefill, mixed steps
    num_kv_blocks=24,  # 96 tokens for 7 sequences of up to 54: forces preemption
    device="cpu",
    dtype="float32",
)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_greedy_equals_transformers_generate(arch: str, overlap: bool) -> None:
    model = tiny_model(arch)
    prompts = random_prompts(PROMPT_LENGTHS, seed=1)
    expected = [hf_greedy(model, p, MAX_NEW) for p in prompts]
    engine = engine_for(model, PREEMPTING, overlap=overlap)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert all(r.finish_reason == "length" for r in results)
    assert engine.stats().preemptions > 0, "the small pool must have forced preemption"
    assert engine.stats().free_kv_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_greedy_stops_at_eos_like_transformers(overlap: bool) -> None:
    # Pick as EOS a token greedy decoding actually produces, so some sequences stop early.
    model = tiny_model("llama", seed=3)
    prompts = random_prompts((2, 7, 11, 16), seed=4)
    free_run = [hf_greedy(model, p, 12) for p in prompts]
    eos = free_run[0][3]
    model = tiny_model("llama", seed=3, eos_token_id=eos)
    expected = [hf_greedy(model, p, 12) for p in prompts]
    engine = engine_for(model, PREEMPTING, overlap=overlap, num_kv_blocks=64)
    results = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert results[0].finish_reason == "stop" and results[0].token_ids[-1] == eos
    for r in results:
        assert r.finish_reason == ("stop" if r.token_ids[-1] == eos else "length")


def _hf_logprobs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    full = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(full).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits / t, dim=-1)
    return logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_logprobs_equal_transformers_forward(arch: str, temperature: float, overlap: bool) -> None:
    model = tiny_model(arch)
    prompts = random_prompts((3, 9, 14), seed=2)
    engine = engine_for(model, PREEMPTING, overlap=overlap, num_kv_blocks=64)
    params = SamplingParams(max_tokens=16, temperature=temperature, n=2, seed=11, top_k=40)
    results = engine.generate(prompts, params)
    for r in results:
        expected = _hf_logprobs(model, r.prompt_token_ids, r.token_ids, temperature)
        got = torch.tensor(r.logprobs)
        assert got.dtype == torch.float32 and len(got) == len(r.token_ids)
        assert torch.max(torch.abs(got - expected)).item() < 1e-4


def test_overlap_equals_sync_with_sampling(arch: str) -> None:
    model = tiny_model(arch, eos_token_id=EOS)
    prompts = random_prompts((2, 5, 8, 13, 21, 4), seed=5)
    params = [
        SamplingParams(max_tokens=20, temperature=1.0, n=3, seed=7),
        SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, n=2, seed=8),
        SamplingParams(max_tokens=20, temperature=1.2, top_k=5, seed=9),
        SamplingParams(max_tokens=15, temperature=1.0, min_p=0.05, n=2),
        SamplingParams(max_tokens=20, temperature=0),
        SamplingParams(max_tokens=18, temperature=1.0, stop_token_ids=(5, 6, 7), n=4, seed=3),
    ]
    runs = [
        engine_for(model, PREEMPTING, overlap=overlap).generate(prompts, params)
        for overlap in (False, True)
    ]
    sync, overlap = runs
    assert [r.token_ids for r in sync] == [r.token_ids for r in overlap]
    assert [r.finish_reason for r in sync] == [r.finish_reason for r in overlap]
    for a, b in zip(sync, overlap, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert any(r.finish_reason == "stop" for r in sync), "some samples should stop early"
