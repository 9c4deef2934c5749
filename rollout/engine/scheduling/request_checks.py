"""Checks a request must pass before it is queued; a failure becomes an "error" completion."""

from __future__ import annotations

from rollout.engine.sampling_params import SamplingParams


def check_prompt(
    token_ids: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    max_num_seqs: int,
    cache_tokens: int,
    has_tokenizer: bool = True,
) -> str | None:
    """None if the request can run; else a message that says what to change."""
    if params.stop and not has_tokenizer:
        return "SamplingParams.stop needs an engine with a tokenizer; use stop_token_ids"
    if len(token_ids) == 0:
        return "prompt is empty: give at least one token"
    bad = [
        t
        for t in token_ids
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size
    ]
    if bad:
        return (
            f"prompt holds token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size}): "
            "check the tokenizer matches the model"
        )
    if len(token_ids) >= max_model_len:
        return (
            f"prompt has {len(token_ids)} tokens; max_model_len is {max_model_len} (room is needed "
            "for at least one new token): shorten the prompt or raise max_model_len"
        )
    needed = min(len(token_ids) + params.max_tokens, max_model_len)
    if needed > cache_tokens:
        return (
            f"the sequence needs up to {needed} tokens of KV cache (prompt {len(token_ids)} + "
            f"max_tokens {params.max_tokens}) but the whole cache holds {cache_tokens}: shorten the "
            "prompt, lower max_tokens, or raise num_kv_blocks"
        )
    if params.n > max_num_seqs:
        return f"n={params.n} samples exceed max_num_seqs={max_num_seqs}: lower n or raise max_num_seqs"
    return None
