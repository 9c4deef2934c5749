"""Speculative decoding (n-gram drafts) in the engine on CPU: exactly the tokens and logprobs of
plain decoding, greedy and sampled, in both loops, with groups and preemption."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollout import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import EOS, engine_for, hf_greedy, random_prompts, tiny_model

PROMPTS = random_prompts((5, 16, 33, 9, 2, 24), seed=3)


SPECULATING = dict(
    device="cpu",
    dtype="float32",
    max_model_len=128,
    max_num_seqs=16,
    max_num_batched_tokens=64,
    speculative="ngram",
    speculative_max_seqs=16,
)


def _speculating_engine(model, **overrides) -> LLMEngine:
    engine = engine_for(model, SPECULATING, **overrides)
    # Try every step: a tiny random model's drafts are rarely accepted, and the pause after
    # empty tries (tested in tests/unit/test_scheduler.py) would leave few verifications here.
    engine.debug_internals().scheduler.speculation.max_pause = 0
    return engine


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_with_speculation_equals_transformers(overlap: bool) -> None:
    model = tiny_model("llama")
    expected = [hf_greedy(model, p, 48) for p in PROMPTS]
    engine = _speculating_engine(
        model, overlap=overlap, num_kv_blocks=20
    )  # 320 tokens for 6 x ~80: preempts
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=48, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0
    stats = engine.stats().speculation
    assert stats.accepted > 20, stats
    assert engine.stats().free_kv_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("overlap", [False, True])
def test_sampled_tokens_and_logprobs_equal_the_plain_run(overlap: bool) -> None:
    """The verification keeps a draft only when it is the token the plain sampler draws at that
    position (same seed, same noise), so a seeded run emits the same tokens with and without
    speculation; groups of 3, EOS allowed to end samples."""
    model = tiny_model("llama", eos_token_id=EOS)
    params = SamplingParams(max_tokens=40, temperature=0.5, n=3, seed=11)
    plain = _speculating_engine(model, speculative="none", overlap=overlap).generate(
        PROMPTS, params
    )
    engine = _speculating_engine(model, overlap=overlap)
    fast = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in fast] == [r.token_ids for r in plain]
    assert [r.finish_reason for r in fast] == [r.finish_reason for r in plain]
    for a, b in zip(fast, plain, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert engine.stats().speculation.accepted > 0, engine.stats().speculation


def _pit_ks(model, prompts, results, temperature: float) -> tuple[float, int]:
    """Kolmogorov-Smirnov distance from uniform of the randomized probability integral transform
    of every emitted token under the model's own distribution at `temperature` (one transformers
    forward per sample): uniform exactly when the tokens are drawn from that distribution."""
    rng = np.random.default_rng(0)
    values = []
    with torch.no_grad():
        for r in results:
            ids = torch.tensor([r.prompt_token_ids + r.token_ids])
            logits = model(ids).logits[0].float()
            start = len(r.prompt_token_ids) - 1
            for i, token in enumerate(r.token_ids):
                probs = torch.softmax(logits[start + i] / temperature, dim=-1).numpy()
                below = probs[:token].sum()
                values.append(below + rng.random() * probs[token])
    u = np.sort(np.clip(values, 0, 1))
    n = len(u)
    ranks = np.arange(1, n + 1) / n
    return float(max(np.max(ranks - u), np.max(u - (ranks - 1 / n)))), n


def test_emitted_tokens_follow_the_models_distribution() -> None:
    """A statistical check beside the exact one above: under speculation the emitted tokens are
    distributed as the model says (3,600 tokens; the test notices a temperature of 0.25 for 0.5)."""
    model = tiny_model("llama")
    prompts = random_prompts((12, 7, 20), seed=5)
    engine = _speculating_engine(
        model, max_num_seqs=128, speculative_max_seqs=128, max_num_batched_tokens=1024
    )
    params = SamplingParams(max_tokens=12, temperature=0.5, n=100, seed=2, ignore_eos=True)
    results = engine.generate(prompts, params)
    assert engine.stats().speculation.accepted > 150, engine.stats().speculation
    distance, n = _pit_ks(model, prompts, results, temperature=0.5)
    critical = 1.95 / n**0.5  # alpha = 0.001
    assert distance < critical, (distance, critical)
    wrong, _ = _pit_ks(model, prompts, results, temperature=0.25)
    assert wrong > critical, "the check has no power: a wrong temperature passes it"


def test_speculation_is_refused_with_a_clear_message_for_bad_settings() -> None:
    with pytest.raises(ValueError, match="speculative must be one of"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens must be a positive int"):
        EngineConfig(speculative="ngram", num_speculative_tokens=0)


@pytest.mark.parametrize("overlap", [False, True])
def test_verification_steps_laid_out_for_a_graph_emit_the_plain_tokens(overlap: bool) -> None:
    """On a GPU decode and verification steps replay CUDA graphs: their sequences padded to a
    bucket, and a verification's each to num_speculative_tokens + 1 tokens (padding first,
    writing no KV). Here the same padded layouts run eagerly on CPU, through the real model and
    sampler, in every step that a graph would take: tokens and logprobs must equal the plain
    run's."""
    from rollout.engine.execution import model_runner
    from rollout.engine.execution.cuda_graph import graph_width, pad_step_inputs

    model = tiny_model("llama", eos_token_id=EOS)
    params = SamplingParams(max_tokens=40, temperature=0.5, n=3, seed=11)
    plain = _speculating_engine(model, speculative="none", overlap=overlap).generate(
        PROMPTS, params
    )
    engine = _speculating_engine(model, overlap=overlap, max_num_batched_tokens=128)
    runner = engine.debug_internals().runner
    launch = runner.launch
    padded_steps = []

    def launch_padded(step_id, inputs):
        width = graph_width(inputs, runner.verify_width)
        if width is None:
            return launch(step_id, inputs)  # a prefill or mixed step: eager on a GPU too
        bucket = 1 << (inputs.num_seqs - 1).bit_length()  # a power of two, as the buckets
        slot = runner.slots[step_id % 2]
        padded = pad_step_inputs(inputs, bucket, width, slot.max_blocks_per_seq)
        padded_steps.append((width, inputs.num_tokens, padded.num_tokens))
        handle = launch(step_id, padded)
        return model_runner.StepHandle(step_id, handle.slot, inputs.num_rows, inputs.num_tokens)

    runner.launch = launch_padded
    fast = engine.generate(PROMPTS, params)
    assert [r.token_ids for r in fast] == [r.token_ids for r in plain]
    for a, b in zip(fast, plain, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert engine.stats().speculation.accepted > 0
    widths = {width for width, _, _ in padded_steps}
    assert widths == {1, runner.verify_width}, widths
    assert any(real < padded for width, real, padded in padded_steps if width > 1)
