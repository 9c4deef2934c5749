"""The families people train with, beyond Llama/Qwen: greedy tokens equal to transformers'
`generate` (fp32, CPU) with sliding windows, softcap and sinks, through chunked prefill and
preemption in both loops; MLA refused up front; a wrapped model left usable."""

from __future__ import annotations

import copy

import pytest
import torch

from rollout import EngineConfig, LLMEngine, SamplingParams
from rollout.engine.model.capabilities import UnsupportedModelError
from tests.model_zoo import MAX_NEW, WINDOW, engine_for, hf_greedy, prompts, tiny_model

# Mistral: one window for all layers; Qwen2: windows from max_window_layers on; Gemma 2: windows
# on alternate layers and logit softcap; Gemma 3, OLMo 3: alternate windowed and full layers;
# gpt-oss: MoE, alternate windows and attention sinks.
FAMILIES = ["mistral", "qwen2", "gemma2", "gemma3_text", "olmo3", "gpt_oss"]


def _window_layers(model) -> list[int | None]:
    """The window each layer's attention asks for, as the model's own modules hold it."""
    config = model.config
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [config.sliding_window if t == "sliding_attention" else None for t in types]
    return [config.sliding_window] * config.num_hidden_layers


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_greedy_equals_generate_with_windows(family: str, overlap: bool) -> None:
    model = tiny_model(family)
    assert WINDOW in _window_layers(model), "the tiny config must have windowed layers"
    cases = prompts(seed=1)
    assert max(len(p) for p in cases) > 3 * WINDOW
    expected = [hf_greedy(model, p) for p in cases]
    # 16 blocks of 4 tokens for three samples of up to 46 tokens: preemption.
    engine = engine_for(model, overlap, num_kv_blocks=16)
    results = engine.generate(cases, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0, "the small pool must have forced preemption"


def test_the_window_changes_the_tokens() -> None:
    """So the test above can fail: without its window the same model samples other tokens."""
    windowed = tiny_model("mistral")
    full = copy.deepcopy(windowed)
    full.config.sliding_window = None
    cases = prompts(seed=1)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    with_window = [r.token_ids for r in engine_for(windowed).generate(cases, params)]
    without = [r.token_ids for r in engine_for(full).generate(cases, params)]
    assert with_window != without
    assert without == [hf_greedy(full, p) for p in cases]


# A softcap that bends these tiny models' logits (scale 1, cap 0.5; Gemma 2's own 50 would not).
SMALL_SOFTCAP = dict(attn_logit_softcapping=0.5, query_pre_attn_scalar=1)


@pytest.mark.parametrize(
    "family, overrides", [("gemma2", SMALL_SOFTCAP), ("gpt_oss", {})], ids=["softcap", "sinks"]
)
def test_logprobs_equal_the_models_forward(family: str, overrides: dict) -> None:
    model = tiny_model(family, **overrides)
    engine = engine_for(model)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    for r in engine.generate(prompts(seed=2), params):
        with torch.no_grad():
            logits = model(torch.tensor([r.prompt_token_ids + r.token_ids])).logits[0]
        expected = torch.log_softmax(logits[len(r.prompt_token_ids) - 1 : -1].float(), -1)
        expected = expected.gather(1, torch.tensor(r.token_ids)[:, None])[:, 0]
        assert torch.max(torch.abs(torch.tensor(r.logprobs) - expected)).item() < 1e-4


def test_sinks_and_softcap_matter() -> None:
    """Zeroed sinks or no softcap change the result: the engine reads both from the model."""
    cases = prompts(seed=3)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)

    def no_sinks(model) -> None:
        for layer in model.model.layers:
            layer.self_attn.sinks.data.fill_(-1e4)

    def no_softcap(model) -> None:
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = None

    for family, overrides, change in [
        ("gpt_oss", {}, no_sinks),
        ("gemma2", SMALL_SOFTCAP, no_softcap),
    ]:
        model = tiny_model(family, **overrides)
        changed = copy.deepcopy(model)
        change(changed)
        a = [r.token_ids for r in engine_for(model).generate(cases, params)]
        b = [r.token_ids for r in engine_for(changed).generate(cases, params)]
        assert a != b, family
        assert a == [hf_greedy(model, p) for p in cases], family
        assert b == [hf_greedy(changed, p) for p in cases], family


def test_mla_is_refused_at_construction_with_what_to_do() -> None:
    model = tiny_model("deepseek_v3")
    with pytest.raises(UnsupportedModelError, match=r"multi-head latent attention.*kv_lora_rank"):
        engine_for(model)


def test_an_attention_argument_the_kernels_do_not_compute_is_refused(monkeypatch) -> None:
    """A model that passes the attention function something unknown is refused while the engine
    is built, naming the argument, not at the first request."""
    from transformers.models.llama import modeling_llama

    model = tiny_model("llama")
    real = modeling_llama.ALL_ATTENTION_FUNCTIONS.get_interface

    def with_extra(name, default):
        function = real(name, default)
        return lambda *args, **kwargs: function(*args, block_mask=True, **kwargs)

    monkeypatch.setattr(modeling_llama.ALL_ATTENTION_FUNCTIONS, "get_interface", with_extra)
    with pytest.raises(UnsupportedModelError, match=r"layer 0: .*\['block_mask'\]"):
        LLMEngine.from_model(
            model, EngineConfig(device="cpu", dtype="float32", fuse_projections=False)
        )


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_a_wrapped_model_still_runs_its_own_attention(family: str) -> None:
    model = tiny_model(family)
    ids = torch.tensor([prompts(seed=4)[2]])
    with torch.no_grad():
        before = model(ids).logits
    engine = LLMEngine.from_model(
        model, EngineConfig(device="cpu", dtype="float32", max_model_len=64, max_num_seqs=4)
    )
    engine.generate([ids[0].tolist()], SamplingParams(max_tokens=4, temperature=0))
    with torch.no_grad():
        after = model(ids).logits
    assert torch.allclose(before, after, atol=1e-5, rtol=1e-5)
    assert model.config._attn_implementation != "rollout_paged"
