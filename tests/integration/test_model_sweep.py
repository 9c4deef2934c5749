"""Every causal-LM family transformers ships (its auto mapping): a tiny random model of each one
that can be built small is either served exactly like `generate` or refused when the engine is
built. Never silently different, never a crash later. Prints the table of outcomes
(`pytest -s tests/integration/test_model_sweep.py`; the table in docs/models.md comes from it)."""

from __future__ import annotations

import re

import pytest

from tests.model_zoo import Outcome, try_family

# Families whose outcome is known: the sweep must keep finding them so.
EXPECTED = {
    "llama": "exact",
    "mistral": "exact",
    "qwen2": "exact",
    "qwen3_moe": "exact",
    "gemma2": "exact",
    "gemma3_text": "exact",
    "gpt_oss": "exact",
    "olmo3": "exact",
    "deepseek_v3": "refused",
    "olmo_hybrid": "refused",
    "granitemoehybrid": "refused",
    "diffllama": "refused",
    "bart": "cannot be built small",
}


# With FP8 weights: the same families served (now the FP8-rounded model, exactly) or refused.
EXPECTED_FP8 = {**EXPECTED, "phimoe": "exact", "mixtral": "exact", "qwen2_moe": "exact"}
# With FP8 activations too: dense families served exactly, MoE ones refused (their experts would
# read unrounded inputs).
EXPECTED_W8A8 = {**EXPECTED, "qwen3_moe": "refused", "gpt_oss": "refused"}


def sweep(expected: dict[str, str], **engine_overrides) -> list[Outcome]:
    """Every family's outcome with these engine settings (the oracle follows them: see
    `try_family`); the known ones as `expected`, none failing."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    outcomes = [
        try_family(family, **engine_overrides)
        for family in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    ]
    print("\n" + table(outcomes))
    by_family = {o.family: o for o in outcomes}
    for family, result in expected.items():
        assert by_family[family].result == result, (family, by_family[family].detail)
    bad = [o for o in outcomes if not o.acceptable]
    assert not bad, "\n".join(f"{o.family}: {o.result}: {o.detail[:300]}" for o in bad)
    return outcomes


@pytest.mark.slow
def test_every_family_is_exact_or_refused_up_front() -> None:
    sweep(EXPECTED)


@pytest.mark.slow
def test_every_family_with_fp8_weights_is_exact_or_refused_up_front() -> None:
    sweep(EXPECTED_FP8, weight_quantization="fp8")


@pytest.mark.slow
def test_every_family_with_an_fp8_kv_cache_is_exact_or_refused_up_front() -> None:
    """The oracle: the model whose attention sees its keys and values rounded as the FP8 cache
    holds them, through its own attention function (softcaps, sinks and windows included)."""
    sweep(EXPECTED, kv_cache_dtype="fp8")


@pytest.mark.slow
def test_every_family_with_fp8_activations_is_exact_or_refused_up_front() -> None:
    """activation_quantization="fp8" (the tiny models' rows are one 128-wide group, so "fp8-group"
    would round them alike): the oracle rounds the input of every projection the engine rounds,
    whatever the family names it."""
    sweep(EXPECTED_W8A8, weight_quantization="fp8", activation_quantization="fp8")


@pytest.mark.slow
def test_every_family_with_ngram_speculation_is_exact_or_refused_up_front() -> None:
    """Verification steps (several query tokens a sequence through the decode kernel, causal
    among themselves) under every family's windows, softcaps and sinks: the tokens and logprobs
    of plain decoding. The greedy outputs of random models repeat themselves, so drafts come."""
    outcomes = sweep(EXPECTED, speculative="ngram", speculative_max_seqs=8)
    exact = [o for o in outcomes if o.result == "exact"]
    unverified = [o.family for o in exact if o.verifications == 0]
    assert len(unverified) < len(exact) / 4, f"few families verified a draft: {unverified}"


def table(outcomes: list[Outcome]) -> str:
    """Markdown: each outcome with its families, and why the refused ones were refused."""
    lines = ["| outcome | families |", "|---|---|"]
    for result in ("exact", "refused", "cannot be built small"):
        names = sorted(o.family for o in outcomes if o.result == result)
        lines.append(f"| {result} ({len(names)}) | {', '.join(names)} |")
    failures = [o for o in outcomes if not o.acceptable]
    for o in failures:
        lines.append(f"| **{o.result}** | {o.family} |")
    by_reason: dict[str, list[str]] = {}
    for o in outcomes:
        if o.result == "refused":
            by_reason.setdefault(reason(o.detail), []).append(o.family)
    lines += ["", "| refused because | families |", "|---|---|"]
    for why, names in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        lines.append(f"| {why} | {', '.join(sorted(names))} |")
    return "\n".join(lines)


def reason(message: str) -> str:
    """The kind of refusal: its first clause, without model names, layer numbers, the values
    of this tiny config and the pointer to docs/models.md."""
    text = message.split("exactly: ", 1)[-1].split(". See docs/models.md")[0]
    text = text.split(": its")[0].split(", so the engine")[0].split("; load")[0]
    text = re.sub(r"^\w+ (computes attention)", r"\1", text)
    text = re.sub(r"^\w+Config (is a composite|gives its layers)", r"the config \1", text)
    text = re.sub(r"^layer \d+: |decoder layers \[[\d, ]+\] ", "", text)
    text = re.sub(r"\(MLA, config.kv_lora_rank=\d+\)", "(MLA)", text)
    text = re.sub(r"keys \[.*", "keys and values of other shapes than the config gives", text)
    for end in (
        ": the paged",
        "; the paged",
        " (layers without",
        ": RuntimeError(",
        ": ValueError(",
    ):
        text = text.split(end)[0]
    return text
