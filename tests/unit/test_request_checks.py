"""check_prompt: None for a runnable request, else a message that says what to change."""

from __future__ import annotations

import pytest

from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.request_checks import check_prompt

LIMITS = dict(vocab_size=100, max_model_len=64, max_num_seqs=8, cache_tokens=256)


def check(token_ids, params=None, **overrides):
    return check_prompt(token_ids, params or SamplingParams(), **{**LIMITS, **overrides})


@pytest.mark.parametrize(
    ("token_ids", "params"),
    [
        ([0], SamplingParams()),
        ([99], SamplingParams()),
        (list(range(63)), SamplingParams(max_tokens=1)),  # max_model_len - 1 tokens
        ([5, 6, 7], SamplingParams(n=8)),  # n == max_num_seqs
    ],
)
def test_good_prompt_returns_none(token_ids, params):
    assert check(token_ids, params) is None


def test_empty_prompt():
    message = check([])
    assert message is not None
    assert "empty" in message


@pytest.mark.parametrize("bad", [-1, 100, 1000, 2.0, "7", None, True])
def test_token_outside_vocabulary_or_not_int(bad):
    message = check([1, 2, bad, 3])
    assert message is not None
    assert "vocabulary" in message
    assert repr(bad) in message
    assert "100" in message  # the vocabulary size


def test_prompt_length_at_max_model_len():
    message = check([1] * 64)
    assert message is not None
    assert "max_model_len" in message
    assert "64" in message
    # One token shorter fits.
    assert check([1] * 63) is None


def test_prompt_plus_max_tokens_exceeds_cache():
    params = SamplingParams(max_tokens=20)
    # 40 + 20 = 60 tokens needed, cache holds 59.
    message = check([1] * 40, params, cache_tokens=59)
    assert message is not None
    assert "num_kv_blocks" in message
    assert "max_tokens" in message
    assert "60" in message and "59" in message
    assert check([1] * 40, params, cache_tokens=60) is None


def test_cache_need_is_capped_by_max_model_len():
    # 10 + 1000 would exceed the cache, but a sequence never grows past max_model_len (64).
    assert check([1] * 10, SamplingParams(max_tokens=1000), cache_tokens=64) is None
    message = check([1] * 10, SamplingParams(max_tokens=1000), cache_tokens=63)
    assert message is not None and "num_kv_blocks" in message


def test_n_exceeds_max_num_seqs():
    message = check([1, 2, 3], SamplingParams(n=9))
    assert message is not None
    assert "max_num_seqs" in message
    assert "n=9" in message
