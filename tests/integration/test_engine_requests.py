"""Requests end to end: bad inputs, n samples sharing prompt blocks, streaming, aborts, seeds."""

from __future__ import annotations

import copy

import pytest

from rollout import Completion, EngineConfig, LLMEngine, SamplingParams
from tests.conftest import (
    EOS,
    VOCAB,
    engine_for,
    hf_greedy,
    random_prompts,
    tiny_model,
    tiny_tokenizer,
)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=1, eos_token_id=EOS)


SMALL_POOL = dict(
    block_size=4,
    max_model_len=64,
    max_num_seqs=8,
    max_num_batched_tokens=32,
    num_kv_blocks=32,
    device="cpu",
)


BAD_PROMPTS = {
    "empty": ([], "empty"),
    "too long for max_model_len": (list(range(3, 67)), "max_model_len"),
    "too long for the cache": (list(range(3, 50)), "num_kv_blocks"),
    "token id past the vocabulary": ([5, VOCAB + 3, 7], "vocabulary"),
    "negative token id": ([5, -4], "vocabulary"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROMPTS))
def test_bad_prompt_alone_gets_an_error_result(model, case: str) -> None:
    prompt, hint = BAD_PROMPTS[case]
    engine = engine_for(model, SMALL_POOL, num_kv_blocks=10)  # 40 cache tokens < max_model_len 64
    [result] = engine.generate([prompt], SamplingParams(max_tokens=4))
    assert result.finish_reason == "error"
    assert hint in result.error
    assert result.token_ids == [] and result.logprobs == []


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_bad_prompts_mixed_with_good_ones(model, overlap: bool) -> None:
    good = random_prompts((4, 9, 6), seed=3)
    bad = [prompt for prompt, _ in BAD_PROMPTS.values()]
    prompts = [good[0], bad[0], good[1], bad[1], bad[2], good[2], bad[3], bad[4]]
    engine = engine_for(model, SMALL_POOL, overlap=overlap, num_kv_blocks=10)
    results = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0, n=2))
    assert len(results) == 2 * len(prompts)
    assert [r.index for r in results] == list(range(2 * len(prompts)))
    for i, prompt in enumerate(prompts):
        pair = results[2 * i : 2 * i + 2]
        if prompt in good:
            assert [r.finish_reason for r in pair] != ["error", "error"]
            assert pair[0].token_ids == hf_greedy(model, prompt, 8)[: len(pair[0].token_ids)]
        else:
            assert all(r.finish_reason == "error" and r.error for r in pair)
    assert engine.stats().free_kv_blocks == engine.num_kv_blocks


def test_n_samples_share_the_prompt_blocks(model) -> None:
    # Prompt of 10 tokens with block_size 4: two full blocks shared by all 4 samples, the partly
    # filled third block copied on write by 3 of them.
    engine = engine_for(model, SMALL_POOL, overlap=False, num_kv_blocks=32)
    engine.add_request(random_prompts((10,), seed=8)[0], SamplingParams(max_tokens=6, n=4, seed=1))
    engine.step()  # prefill once + first token of each sample
    assert engine.stats().preemptions == 0
    seqs = engine.debug_internals().scheduler.running
    assert len(seqs) == 4
    assert len({tuple(s.block_table) for s in seqs}) == 1, "all samples reference the prompt blocks"
    assert engine.stats().free_kv_blocks == 32 - 3, "the prompt was prefilled once"
    engine.step()  # first decode: copy-on-write of the partial block
    tables = [s.block_table for s in engine.debug_internals().scheduler.running]
    assert len({tuple(t[:2]) for t in tables}) == 1, "full prompt blocks stay shared"
    assert len({t[2] for t in tables}) == 4, "each sample owns its last block"
    assert all(engine.debug_internals().block_manager.ref_counts[b] == 4 for b in tables[0][:2])
    assert engine.stats().free_kv_blocks == 32 - 2 - 4
    results = []
    while engine.has_unfinished():
        results += engine.step()
    assert sorted(r.index for r in results) == [0, 1, 2, 3]
    assert len({tuple(r.token_ids) for r in results}) > 1, "sampled completions differ"
    assert engine.stats().free_kv_blocks == 32


def test_same_seed_same_tokens_whatever_the_batch(model) -> None:
    prompt = random_prompts((7,), seed=9)[0]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1234, n=2)
    alone = engine_for(model, SMALL_POOL).generate([prompt], params)
    others = random_prompts((3, 12, 5), seed=10)
    crowded = engine_for(model, SMALL_POOL, overlap=False, num_kv_blocks=12).generate(
        [*others, prompt], [SamplingParams(max_tokens=12, temperature=1.0)] * 3 + [params]
    )
    assert [r.token_ids for r in alone] == [r.token_ids for r in crowded[-2:]]
    assert alone[0].token_ids != alone[1].token_ids
    different_seed = engine_for(model, SMALL_POOL).generate(
        [prompt], SamplingParams(max_tokens=12, seed=99)
    )
    assert different_seed[0].token_ids != alone[0].token_ids


def test_stream_yields_each_sample_once_as_it_finishes(model) -> None:
    prompts = random_prompts((3, 5, 8), seed=11)
    params = [SamplingParams(max_tokens=m, ignore_eos=True, n=2) for m in (20, 2, 9)]
    order = [c.index for c in engine_for(model, SMALL_POOL).stream(prompts, params)]
    assert sorted(order) == list(range(6))
    assert set(order[:2]) == {2, 3}, "the shortest request finishes first"


def test_ignore_eos_and_stop_token_ids(model) -> None:
    prompt = random_prompts((6,), seed=12)[0]
    free = engine_for(model, SMALL_POOL).generate(
        [prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    )
    tokens = free[0].token_ids
    assert len(tokens) == 20 and free[0].finish_reason == "length"
    stop = tokens[5]
    stopped = engine_for(model, SMALL_POOL).generate(
        [prompt],
        SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[stop]),
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == tokens[: tokens.index(stop) + 1]


def test_generation_stops_at_max_model_len(model) -> None:
    prompt = random_prompts((60,), seed=13)[0]
    [r] = engine_for(model, SMALL_POOL, num_kv_blocks=20).generate(
        [prompt], SamplingParams(max_tokens=30, ignore_eos=True)
    )
    assert r.finish_reason == "length" and len(r.token_ids) == 64 - 60


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_abort_ends_a_request_and_keeps_the_others(model, overlap: bool) -> None:
    engine = engine_for(model, SMALL_POOL, overlap=overlap)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    engine.add_request(random_prompts((5,), seed=14)[0], params, request_id="keep")
    engine.add_request(
        random_prompts((6,), seed=15)[0],
        params.__class__(max_tokens=30, n=3, ignore_eos=True),
        request_id="drop",
        first_index=1,
    )
    done: list[Completion] = []
    for _ in range(4):
        done += engine.step()
    engine.abort("drop")
    while engine.has_unfinished():
        done += engine.step()
    by_request = {}
    for c in done:
        by_request.setdefault(c.request_id, []).append(c)
    assert [c.finish_reason for c in by_request["keep"]] == ["length"]
    assert len(by_request["keep"][0].token_ids) == 30
    aborted = by_request["drop"]
    assert sorted(c.index for c in aborted) == [1, 2, 3]
    assert all(c.finish_reason == "abort" and 0 < len(c.token_ids) < 30 for c in aborted)
    assert all(len(c.token_ids) == len(c.logprobs) for c in aborted)
    assert engine.stats().free_kv_blocks == engine.num_kv_blocks


def test_string_prompts_use_the_tokenizer(model) -> None:
    tokenizer = tiny_tokenizer()
    engine = engine_for(model, SMALL_POOL, tokenizer=tokenizer)
    [r] = engine.generate(["w5 w17 w33"], SamplingParams(max_tokens=4, temperature=0))
    assert r.prompt_token_ids == [5, 17, 33]
    assert r.token_ids == hf_greedy(model, [5, 17, 33], 4)[: len(r.token_ids)]


def test_string_prompt_without_tokenizer_is_a_clear_error(model) -> None:
    with pytest.raises(ValueError, match="no tokenizer"):
        engine_for(model, SMALL_POOL).generate(["hello"], SamplingParams())


def test_params_list_must_match_prompts(model) -> None:
    with pytest.raises(ValueError, match="one per prompt"):
        engine_for(model, SMALL_POOL).generate([[3, 4], [5]], [SamplingParams()])


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_queue_wait_counts_the_time_before_a_first_step(model, overlap: bool) -> None:
    """Room for one group of two: the second waits for the first to finish; the samples forked
    from a prompt report its wait."""
    import time

    engine = engine_for(model, SMALL_POOL, overlap=overlap, max_num_seqs=2)
    first, second = random_prompts((5, 6), seed=8)
    params = SamplingParams(max_tokens=12, ignore_eos=True, n=2)
    start = time.perf_counter()
    done_at, waits = {}, {}
    for result in engine.stream([first, second], params):
        done_at[result.index] = time.perf_counter() - start
        waits[result.index] = result.queue_wait_s
    first_group_done = max(done_at[0], done_at[1])
    assert waits[0] == waits[1] and waits[2] == waits[3]
    assert 0.0 <= waits[0] < 0.1 * first_group_done
    # The second group starts as the first ends (a step earlier in the overlap loop, which
    # schedules the next step before it hands out the last one's results).
    assert waits[2] > 0.6 * first_group_done


@pytest.mark.parametrize("speculative", ["none", "ngram"])
def test_a_stop_string_ends_the_sample_at_the_token_that_completes_it(speculative: str) -> None:
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    settings = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4)
    config = EngineConfig(**settings, speculative=speculative, speculative_max_seqs=4)
    engine = LLMEngine.from_model(copy.deepcopy(model), config, tokenizer=tokenizer)
    prompt = random_prompts((7,), seed=13)[0]
    plain = engine.generate([prompt], SamplingParams(max_tokens=30, temperature=0))[0]
    words = tokenizer.decode(plain.token_ids).split()
    stop = f"{words[5]} {words[6]}"  # spans two tokens
    first = next(i for i in range(1, len(words)) if f"{words[i - 1]} {words[i]}" == stop)
    params = SamplingParams(max_tokens=30, temperature=0, stop=(stop, "never-seen"))
    done = engine.generate([prompt], params)[0]
    assert done.finish_reason == "stop"
    assert done.token_ids == plain.token_ids[: first + 1]


def test_stop_strings_without_a_tokenizer_are_an_error_result() -> None:
    engine = LLMEngine.from_model(
        tiny_model("llama"), EngineConfig(device="cpu", dtype="float32", max_model_len=64)
    )
    (done,) = engine.generate([[3, 4, 5]], SamplingParams(max_tokens=4, stop=("x",)))
    assert done.finish_reason == "error" and "tokenizer" in done.error


@pytest.mark.parametrize("overlap", [True, False])
def test_each_sample_stops_at_its_own_planned_length(model, overlap: bool) -> None:
    """sample_lengths (a benchmark's planned lengths): each of a group's samples ends with
    "length" at its own count, the forks after the shared prompt included; the tokens are the
    same as the group's without the plan, cut at those counts (same seed)."""
    engine = engine_for(model, SMALL_POOL, overlap=overlap, num_kv_blocks=64)
    prompt = random_prompts((5,), seed=2)[0]
    lengths = (1, 9, 3, 16)
    planned = SamplingParams(
        max_tokens=16, n=4, seed=7, ignore_eos=True, sample_lengths=lengths, temperature=1.0
    )
    free = SamplingParams(max_tokens=16, n=4, seed=7, ignore_eos=True, temperature=1.0)
    cut = engine.generate([prompt], planned)
    full = engine.generate([prompt], free)
    assert [len(c.token_ids) for c in cut] == list(lengths)
    assert all(c.finish_reason == "length" for c in cut)
    for short, whole in zip(cut, full, strict=True):
        assert short.token_ids == whole.token_ids[: len(short.token_ids)]
    with pytest.raises(ValueError, match="sample_lengths must hold n=4 ints in"):
        SamplingParams(max_tokens=16, n=4, sample_lengths=(1, 2, 3))
    with pytest.raises(ValueError, match="max_tokens=16"):
        SamplingParams(max_tokens=16, n=2, sample_lengths=(1, 17))
