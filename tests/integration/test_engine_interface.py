"""LLMEngine's public interface beyond requests: stats(), reset_stats(), measure_device_time(),
update_weights(); and that the construction-time forward leaves no trace in any of them."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from rollout.engine.seeds import request_seed
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model

SMALL = dict(device="cpu", dtype="float32", block_size=4, max_model_len=64, max_num_seqs=8)


def test_a_new_engine_reports_nothing_run_yet() -> None:
    """The forward check ran a prefill and a decode step through its own scheduler: none of it
    shows in the engine's counters, blocks or prefix cache."""
    engine = engine_for(tiny_model("llama"), SMALL, num_kv_blocks=16)
    stats = engine.stats()
    assert (stats.steps, stats.preemptions, stats.prefix_hit_tokens) == (0, 0, 0)
    assert (stats.running_sequences, stats.waiting_sequences, stats.cached_kv_blocks) == (0, 0, 0)
    assert stats.free_kv_blocks == stats.num_kv_blocks == 16
    assert stats.device_s is None and stats.kv_cache_use == 0.0


def test_the_first_request_takes_the_first_derived_seed() -> None:
    """The check's request must not shift the seeds derived from arrival order."""
    model = tiny_model("llama")
    (prompt,) = random_prompts((7,), seed=2)
    unseeded = SamplingParams(max_tokens=10, temperature=1.0)
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=request_seed(0, 0))
    first = engine_for(model, SMALL, seed=0).generate([prompt], unseeded)[0]
    explicit = engine_for(model, SMALL, seed=0).generate([prompt], seeded)[0]
    other = engine_for(model, SMALL, seed=1).generate([prompt], unseeded)[0]
    assert first.token_ids == explicit.token_ids
    assert first.token_ids != other.token_ids


def test_stats_count_a_run_and_reset_stats_starts_again() -> None:
    engine = engine_for(tiny_model("llama"), SMALL, num_kv_blocks=12, max_num_batched_tokens=16)
    engine.measure_device_time()
    prompts = random_prompts((9, 13, 11, 8), seed=5)
    params = SamplingParams(max_tokens=20, n=2, ignore_eos=True, seed=1)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()
    during = engine.stats()
    # A request is one sequence until its prompt is computed; then its samples fork off it.
    assert during.running_sequences > 0 and during.waiting_sequences > 0
    assert 0 < during.kv_cache_use <= 1
    lengths = []
    while engine.has_unfinished():
        lengths += [len(c.token_ids) for c in engine.step()]
    assert lengths == [20] * 8
    stats = engine.stats()
    assert stats.steps > 20 and stats.preemptions > 0  # 12 blocks of 4 for 8 x 31 tokens
    assert stats.device_s is not None and stats.device_s > 0
    assert stats.running_sequences == stats.waiting_sequences == stats.running_output_tokens == 0
    engine.reset_stats()
    again = engine.stats()
    assert (again.steps, again.preemptions, again.prefix_hit_tokens, again.device_s) == (0, 0, 0, 0)


def test_update_weights_copies_by_name_in_place() -> None:
    model, trained = tiny_model("llama", seed=0), tiny_model("llama", seed=7)
    engine = engine_for(model, SMALL)
    (prompt,) = random_prompts((12,), seed=4)
    storage = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    engine.update_weights(trained.named_parameters())
    assert {n: p.data_ptr() for n, p in engine.model.named_parameters()} == storage
    [r] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0))
    assert r.token_ids == hf_greedy(trained, prompt, 12)
    # A function that copies into the model itself: what weight sync's receiver passes.
    assert engine.update_weights(lambda m: m.load_state_dict(model.state_dict()) and "done")
    [r] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0))
    assert r.token_ids == hf_greedy(model, prompt, 12)


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown name", "not among the model's parameters"),
        ("wrong shape", "shape mismatch"),
        ("a module", "pass model.named_parameters"),
        ("a NaN", r"hold NaN or infinity; nothing was copied"),
    ],
)
def test_update_weights_refuses_what_does_not_fit_and_copies_nothing(case, message) -> None:
    model = tiny_model("llama")
    engine = engine_for(model, SMALL)
    before = {n: p.clone() for n, p in engine.model.named_parameters()}
    changed = [(n, p + 1) for n, p in model.named_parameters()]  # the first ones would fit
    weights = {
        "unknown name": changed[:3] + [("model.no_such.weight", torch.zeros(1))],
        "wrong shape": changed[:3] + [(changed[0][0], torch.zeros(3))],
        "a module": model,
        "a NaN": changed[:3] + [(changed[3][0], torch.full_like(changed[3][1], float("nan")))],
    }[case]
    with pytest.raises(ValueError, match=message):
        engine.update_weights(weights)
    for name, param in engine.model.named_parameters():
        assert torch.equal(param, before[name]), name


@pytest.mark.parametrize("quantization", ["none", "fp8"])
def test_a_function_that_writes_nan_leaves_an_engine_that_refuses_to_step(quantization) -> None:
    """Weight sync's receiver writes into the model itself, so non-finite values are found
    after the copy: the update raises naming them, and the engine runs no step on them (an
    error, not NaN logits sampled as tokens) until an update with finite weights."""
    from rollout.engine.weight_update import NonFiniteWeightsError

    model = tiny_model("llama", seed=3)
    engine = engine_for(model, SMALL, weight_quantization=quantization)
    prompt = random_prompts((5,), seed=1)[0]
    params = SamplingParams(max_tokens=8, temperature=0)
    [before] = engine.generate([prompt], params)

    def poison(m: torch.nn.Module) -> None:
        m.get_decoder().layers[1].mlp.down_proj.weight[0, 0] = float("inf")

    with pytest.raises(NonFiniteWeightsError, match=r"1 weight\(s\) hold NaN or inf") as raised:
        engine.update_weights(poison)
    assert any("layers.1.mlp.down_proj" in name for name in raised.value.names)
    with pytest.raises(RuntimeError, match=r"hold NaN or inf \(.*down_proj.*update_weights with"):
        engine.generate([prompt], params)
    engine.update_weights(model.named_parameters())  # finite again: it runs as before
    [after] = engine.generate([prompt], params)
    assert after.token_ids == before.token_ids
