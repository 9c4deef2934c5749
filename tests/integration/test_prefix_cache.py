"""The prefix cache in the engine on CPU: a conversation's next turn reuses the KV of the turn
before and is exact (greedy tokens and logprobs equal a fresh forward over the whole sequence);
weight changes empty it."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model

CPU_FP32 = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=8)


def _logprobs(model, ids: list[int], start: int) -> list[float]:
    """The model's own log-softmax at each token from `start` on (a fresh forward)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[i - 1, ids[i]].item() for i in range(start, len(ids))]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_next_turn_reuses_the_kv_and_equals_a_fresh_forward(overlap: bool) -> None:
    model = tiny_model("llama")
    engine = engine_for(model, CPU_FP32, overlap=overlap)
    (prompt,) = random_prompts((21,), seed=8)
    first = engine.generate([prompt], SamplingParams(max_tokens=30, temperature=0))[0]
    tool_output = [7, 8, 9, 10, 11]  # tokens the model did not generate
    turn = prompt + first.token_ids + tool_output
    hits_before = engine.stats().prefix_hit_tokens
    second = engine.generate([turn], SamplingParams(max_tokens=20, temperature=1.0, seed=3))[0]
    reused = engine.stats().prefix_hit_tokens - hits_before
    assert reused == 48, "every full block of the first turn (51 tokens, blocks of 16)"
    greedy = engine.generate([turn], SamplingParams(max_tokens=20, temperature=0))[0]
    assert greedy.token_ids == hf_greedy(model, turn, 20)
    want = _logprobs(model, turn + second.token_ids, len(turn))
    assert max(abs(a - b) for a, b in zip(second.logprobs, want, strict=True)) < 1e-4


def test_groups_and_a_shared_system_prefix_hit_the_cache() -> None:
    model = tiny_model("qwen3")
    engine = engine_for(model, CPU_FP32)
    system = random_prompts((40,), seed=9)[0]
    questions = random_prompts((5, 9, 3), seed=10)
    engine.generate([system + questions[0]], SamplingParams(max_tokens=4, temperature=0))
    prompts = [system + q for q in questions[1:]]
    results = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0, n=2))
    assert engine.stats().prefix_hit_tokens >= 2 * 32  # two 16-token blocks, each prompt
    expected = [hf_greedy(model, p, 12) for p in prompts]
    assert [r.token_ids for r in results] == [e for e in expected for _ in range(2)]


def test_changed_weights_are_never_served_from_the_cache() -> None:
    model = tiny_model("llama")
    engine = engine_for(model, CPU_FP32)
    (prompt,) = random_prompts((40,), seed=11)
    engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0))
    assert engine.stats().cached_kv_blocks > 0
    with torch.no_grad():  # new weights, as a trainer's step makes them
        for p in model.parameters():
            p.mul_(1.5)
    engine.update_weights(model.named_parameters())
    assert engine.stats().cached_kv_blocks == 0
    hits_before = engine.stats().prefix_hit_tokens
    again = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0))[0]
    assert engine.stats().prefix_hit_tokens == hits_before
    assert again.token_ids == hf_greedy(model, prompt, 8)


def test_caching_off_computes_every_token() -> None:
    engine = engine_for(tiny_model("llama"), CPU_FP32, enable_prefix_caching=False)
    (prompt,) = random_prompts((40,), seed=12)
    for _ in range(2):
        engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0))
    assert engine.stats().prefix_hit_tokens == 0
