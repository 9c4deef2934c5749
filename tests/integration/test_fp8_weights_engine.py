"""FP8 weights in the engine (`EngineConfig(weight_quantization="fp8")`, fp32 on CPU): the engine
serves exactly the model whose projection and expert weights are their FP8 values, and keeps
serving the rounded model after weight updates."""

from __future__ import annotations

import copy

import pytest
import torch

from rollout import EngineConfig, LLMEngine, SamplingParams
from rollout.engine.model.capabilities import UnsupportedModelError
from rollout.kernels.torch_fp8 import dequantize_rows
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model
from tests.fp8_oracle import expected_rounded, rounded_copy, wide_model_with_outliers

SETTINGS = dict(
    block_size=4,
    max_model_len=96,
    max_num_seqs=8,
    max_num_batched_tokens=12,  # chunked prefill
    num_kv_blocks=64,
    device="cpu",
    dtype="float32",
    weight_quantization="fp8",
)
# FP8 activations and LM head too
W8A8 = dict(SETTINGS, activation_quantization="fp8", fp8_lm_head=True)
# ... with a scale per 128 inputs of a row
W8A8_GROUPS = dict(W8A8, activation_quantization="fp8-group")
# ... and the LM head's input rounded too
W8A8_HEAD_INPUT = dict(W8A8, fp8_lm_head_input=True)
PROMPT_LENGTHS = (1, 4, 9, 17, 30)
MAX_NEW = 20
ARCHS = ["llama", "qwen2", "qwen3", "qwen3_moe"]


def _sampled_logprobs(oracle, prompt: list[int], token_ids: list[int]) -> torch.Tensor:
    """The log-probability `oracle` (a transformers model) gives each sampled token."""
    with torch.no_grad():
        logits = oracle(torch.tensor([prompt + token_ids])).logits[0]
    every = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    return every.gather(1, torch.tensor(token_ids)[:, None])[:, 0]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_the_engine_serves_the_fp8_rounded_model_exactly(arch: str, overlap: bool) -> None:
    model = tiny_model(arch, seed=5)
    reference = rounded_copy(model)
    prompts = random_prompts(PROMPT_LENGTHS, seed=2)
    engine = engine_for(model, SETTINGS, overlap=overlap)
    # the engine's model is the oracle's, weight for weight, and only the covered ones changed
    engine_params = dict(engine.model.named_parameters())
    for name, param in reference.named_parameters():
        assert torch.equal(engine_params[name], param), name
        changed = not torch.equal(param, dict(model.named_parameters())[name])
        assert changed == expected_rounded(name), name
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    # the FP8 bytes the decode GEMMs read stand for exactly those weights
    fp8 = engine.debug_internals().runner.prepared.fp8_weights
    assert fp8.weights and engine.stats().fp8_round_s is not None
    for w in fp8.weights:
        assert torch.equal(dequantize_rows(w.q, w.scale, w.weight.dtype), w.weight), w.name


@pytest.mark.parametrize("more", [False, True], ids=["weights", "with_head_and_inputs"])
def test_sampled_logprobs_are_the_rounded_models(more: bool) -> None:
    model = tiny_model("qwen3", seed=6)
    reference = rounded_copy(model, lm_head=more, input_scales="row" if more else None)
    prompt = random_prompts((7,), seed=3)[0]
    engine = engine_for(model, W8A8 if more else SETTINGS)
    [result] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=4))
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + result.token_ids])).logits[0]
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    want = logprobs.gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(result.logprobs), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_a_weight_update_is_rounded_again_in_place(arch: str) -> None:
    engine = engine_for(tiny_model(arch, seed=1), SETTINGS)
    before = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    new = tiny_model(arch, seed=2)  # bf16-style full-precision weights, as a trainer sends them
    engine.update_weights(list(new.named_parameters()))
    assert {n: p.data_ptr() for n, p in engine.model.named_parameters()} == before
    reference = rounded_copy(new)
    prompts = random_prompts((5, 13), seed=7)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    # a receiver function (weight sync's path) is rounded after it too
    engine.update_weights(lambda m: m.get_decoder().layers[0].self_attn.o_proj.weight.fill_(0.3))
    o_proj = engine.model.get_decoder().layers[0].self_attn.o_proj.weight
    # 0.3 is not an e4m3 value times a power of two: with scale 2^-10 it rounds to 320 x 2^-10
    assert torch.all(o_proj == 0.3125)


def test_a_weight_update_that_is_not_finite_is_refused_with_its_names() -> None:
    # The GPU kernels widen e4m3's NaN to a finite value: a NaN weight must not reach them.
    engine = engine_for(tiny_model("llama", seed=1), SETTINGS)
    with pytest.raises(ValueError, match=r"1 weight\(s\) hold NaN or inf \(.*o_proj.*diverged"):
        engine.update_weights(
            lambda m: m.get_decoder().layers[0].self_attn.o_proj.weight[3, 5].fill_(float("nan"))
        )


def test_unknown_quantization_and_unquantizable_models_are_refused() -> None:
    with pytest.raises(ValueError, match="weight_quantization must be one of"):
        EngineConfig(weight_quantization="int4")

    class NoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()

        def get_output_embeddings(self):
            return None

    from rollout.engine.model.fp8_weights import quantized_tensors

    with pytest.raises(UnsupportedModelError, match="weight_quantization='none'"):
        quantized_tensors(NoLayers())


def test_fp8_off_leaves_the_weights_alone() -> None:
    model = tiny_model("llama", seed=3)
    engine = LLMEngine.from_model(
        copy.deepcopy(model), EngineConfig(**{**SETTINGS, "weight_quantization": "none"})
    )
    for (name, a), b in zip(model.named_parameters(), engine.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert engine.stats().fp8_round_s is None


def test_a_later_engine_without_fp8_drops_the_copies_and_the_roofline_counts_them() -> None:
    from benchmarks.lib.roofline import weight_bytes_per_step, weight_split

    model = tiny_model("qwen3_moe", seed=4)
    plain_bytes, plain_split = weight_bytes_per_step(model), weight_split(model)
    LLMEngine.from_model(model, EngineConfig(**SETTINGS))  # rounds `model` itself
    # the quantized weights are read as one byte each, plus a 4-byte scale per row
    quantized = [p for n, p in model.named_parameters() if expected_rounded(n)]
    saved = sum(p.numel() * (p.element_size() - 1) - 4 * p[..., 0].numel() for p in quantized)
    assert weight_bytes_per_step(model) == plain_bytes - saved
    experts = [p for n, p in model.named_parameters() if "experts." in n]
    expert_saved = sum(p.numel() * (p.element_size() - 1) - 4 * p[..., 0].numel() for p in experts)
    assert weight_split(model).expert_bytes == plain_split.expert_bytes - expert_saved
    engine = LLMEngine.from_model(
        model, EngineConfig(**{**SETTINGS, "weight_quantization": "none"})
    )
    assert not any(
        hasattr(m, "_fp8") or "forward" in vars(m)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    )
    assert weight_bytes_per_step(model) == plain_bytes
    new = tiny_model("qwen3_moe", seed=9)
    engine.update_weights(list(new.named_parameters()))  # not rounded: this engine serves bf16
    prompts = random_prompts((6, 11), seed=8)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(new, p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize("family", ["phimoe", "mixtral", "qwen2_moe"])
def test_routers_and_linear_subclasses_stay_unrounded(family: str) -> None:
    """Routers (a `gate` linear, a `router` that subclasses nn.Linear, a shared-expert gate) keep
    their weights; the experts and projections are rounded."""
    from tests import model_zoo

    model = model_zoo.tiny_model(family)
    engine = engine_for(model, SETTINGS)
    before = dict(model.named_parameters())
    changed = {n for n, p in engine.model.named_parameters() if not torch.equal(p, before[n])}
    routers = [
        n for n in before if n.endswith(("mlp.gate.weight", "router.weight", "expert_gate.weight"))
    ]
    assert routers and not changed & set(routers)
    assert any("experts" in n for n in changed) and any("q_proj" in n for n in changed)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_rounded_inputs_and_head_serve_their_model_exactly(arch: str, overlap: bool) -> None:
    """activation_quantization="fp8" with fp8_lm_head: the engine serves the FP8 model whose
    layer projections see their inputs rounded (every row, prefill and decode alike) and whose
    LM head is rounded too (its input is not)."""
    model = tiny_model(arch, seed=5)
    reference = rounded_copy(model, lm_head=True, input_scales="row")
    prompts = random_prompts(PROMPT_LENGTHS, seed=2)
    engine = engine_for(model, W8A8, overlap=overlap)
    engine_params = dict(engine.model.named_parameters())
    for name, param in reference.named_parameters():
        assert torch.equal(engine_params[name], param), name
    assert not torch.equal(engine_params["lm_head.weight"], model.lm_head.weight)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    # and not the model with unrounded inputs: the rounding is there to be seen
    weights_only = rounded_copy(model, lm_head=True)
    assert [r.token_ids for r in results] != [hf_greedy(weights_only, p, MAX_NEW) for p in prompts]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_the_heads_rounded_input_serves_its_model_exactly(arch: str, overlap: bool) -> None:
    """fp8_lm_head_input: greedy tokens and sampled logprobs are the model's whose LM head rounds
    its input as the layers' projections do, and measurably not the one whose head does not."""
    model = tiny_model(arch, seed=5)
    reference = rounded_copy(model, lm_head=True, input_scales="row", head_input=True)
    prompts = random_prompts(PROMPT_LENGTHS, seed=2)
    engine = engine_for(model, W8A8_HEAD_INPUT, overlap=overlap)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    prompt = prompts[-1]
    [sampled] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=4))
    got = torch.tensor(sampled.logprobs)
    want = _sampled_logprobs(reference, prompt, sampled.token_ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    head_unrounded = rounded_copy(model, lm_head=True, input_scales="row")
    assert (got - _sampled_logprobs(head_unrounded, prompt, sampled.token_ids)).abs().max() > 1e-4


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_group_rounded_inputs_serve_their_model_exactly(overlap: bool) -> None:
    """activation_quantization="fp8-group": the engine serves the model whose projections see
    their inputs rounded with a scale per 128 inputs of a row, prefill and decode alike."""
    model = wide_model_with_outliers(seed=12)
    reference = rounded_copy(model, lm_head=True, input_scales="group")
    prompts = random_prompts(PROMPT_LENGTHS, seed=2)
    engine = engine_for(model, W8A8_GROUPS, overlap=overlap)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]


def test_group_scales_are_the_model_served_not_row_scales() -> None:
    """The sampled logprobs are the group-rounded model's, and measurably not the row-rounded
    one's (whose rounding of the outlier rows loses the other groups' small values)."""
    model = wide_model_with_outliers(seed=13)
    prompt = random_prompts((7,), seed=3)[0]
    engine = engine_for(model, W8A8_GROUPS)
    [result] = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=4))
    got = torch.tensor(result.logprobs)
    group_model = rounded_copy(model, lm_head=True, input_scales="group")
    group = _sampled_logprobs(group_model, prompt, result.token_ids)
    torch.testing.assert_close(got, group, rtol=1e-5, atol=1e-5)
    row_model = rounded_copy(model, lm_head=True, input_scales="row")
    row = _sampled_logprobs(row_model, prompt, result.token_ids)
    assert (got - row).abs().max() > 1e-3


def test_fp8_extensions_need_fp8_weights_and_a_model_they_fit() -> None:
    for extra in (
        dict(fp8_lm_head=True),
        dict(activation_quantization="fp8"),
        dict(activation_quantization="fp8-group"),
    ):
        with pytest.raises(ValueError, match="needs weight_quantization='fp8'"):
            EngineConfig(**{**SETTINGS, "weight_quantization": "none", **extra})
    with pytest.raises(ValueError, match="activation_quantization must be one of"):
        EngineConfig(**{**SETTINGS, "activation_quantization": "int8"})
    for missing in (dict(fp8_lm_head=False), dict(activation_quantization="none")):
        with pytest.raises(ValueError, match="fp8_lm_head_input .* needs fp8_lm_head=True"):
            EngineConfig(**{**W8A8_HEAD_INPUT, **missing})
    for settings in (W8A8, W8A8_GROUPS):
        with pytest.raises(
            UnsupportedModelError, match="MoE experts.*activation_quantization='none'"
        ):
            engine_for(tiny_model("qwen3_moe", seed=1), settings)
    tied = tiny_model("llama", seed=1)
    tied.lm_head.weight = tied.get_input_embeddings().weight
    with pytest.raises(UnsupportedModelError, match="ties its LM head.*fp8_lm_head=False"):
        engine_for(tied, W8A8)


def test_a_later_engine_without_the_fp8_head_drops_its_copy() -> None:
    """Engines over one in-memory model: an FP8 head replaces an earlier engine's routing of it,
    and a later engine without fp8_lm_head does not keep reading its FP8 copy (stale after the
    next weight update)."""
    from rollout.engine.model.fp8_linear import fp8_linear_forward

    model = tiny_model("llama", seed=7)
    # as an earlier engine on a GPU leaves it: the head routed through the bf16 decode GEMM
    model.lm_head._plain_forward = model.lm_head.forward
    model.lm_head.forward = lambda x: model.lm_head._plain_forward(x)
    LLMEngine.from_model(model, EngineConfig(**W8A8))
    assert model.lm_head.forward.__func__ is fp8_linear_forward  # the FP8 copy is what it reads
    engine = LLMEngine.from_model(model, EngineConfig(**SETTINGS))
    assert not hasattr(model.lm_head, "_fp8") and "forward" not in vars(model.lm_head)
    assert all(
        w.name != "lm_head.weight"
        for w in engine.debug_internals().runner.prepared.fp8_weights.weights
    )
    new = tiny_model("llama", seed=8)
    engine.update_weights(list(new.named_parameters()))
    reference = rounded_copy(new)  # the head as sent, the layers rounded
    prompts = random_prompts((5, 12), seed=9)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]


def test_rounding_norms_serve_the_rounded_model_and_leave_with_their_engine(monkeypatch) -> None:
    """FP8 activations: the layers of the known classes round their q/k/v and gate/up inputs in
    their norms, the MLPs down's in their activation (rounded_layers.py, triton_rounded_rows);
    a layer that is not one keeps its own forward, whose projections round their inputs
    themselves, and serves the same model; a later engine over the same in-memory model without
    FP8 activations gets the layers' own forwards back."""
    from rollout.engine.model.rounded_layers import _rounding_layer_forward
    from rollout.kernels import torch_rounded_rows

    calls = {"rms_norm_rounded": 0, "silu_mul_rounded": 0}
    for name in calls:
        twin = getattr(torch_rounded_rows, name)

        def counted(*args, name=name, twin=twin, **kwargs):
            calls[name] += 1
            return twin(*args, **kwargs)

        monkeypatch.setattr(torch_rounded_rows, name, counted)

    model = tiny_model("qwen3", seed=14)
    norm = model.model.layers[1].input_layernorm
    norm.__class__ = type("OtherRMSNorm", (type(norm),), {})  # the same norm, not a known class
    reference = rounded_copy(model, lm_head=True, input_scales="row")
    prompts = random_prompts(PROMPT_LENGTHS, seed=6)
    engine = LLMEngine.from_model(model, EngineConfig(**W8A8))
    assert engine.debug_internals().runner.prepared.rounded_layers == 1
    first, second = model.model.layers
    assert first.forward.__func__ is _rounding_layer_forward and "forward" not in vars(second)
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [r.token_ids for r in results] == [hf_greedy(reference, p, MAX_NEW) for p in prompts]
    # (CPU: the ops run their twins) two norms a step in the changed layer, an act in both
    assert 0 < calls["rms_norm_rounded"] == calls["silu_mul_rounded"]
    LLMEngine.from_model(model, EngineConfig(**SETTINGS))
    assert "forward" not in vars(first) and not hasattr(first, "_unrounded_forward")


@pytest.mark.parametrize("scales", ["row", "group"])
def test_speculation_with_rounded_inputs_emits_the_plain_tokens(scales: str) -> None:
    """Each row is rounded on its own, so a verification (more rows a step) computes each
    token as a plain step does: the drafted run emits the plain run's tokens."""
    if scales == "row":
        model, settings = tiny_model("qwen3", seed=10), W8A8
    else:
        model, settings = wide_model_with_outliers(seed=10), W8A8_GROUPS
    prompts = [p * 3 for p in random_prompts((4, 6, 9), seed=11)]  # repeats: n-grams to draft
    for params in (
        SamplingParams(max_tokens=30, temperature=0),
        SamplingParams(max_tokens=30, temperature=0.7, n=2, seed=4),
    ):
        plain = engine_for(model, settings).generate(prompts, params)
        engine = engine_for(model, settings, speculative="ngram", speculative_max_seqs=8)
        engine.debug_internals().scheduler.speculation.max_pause = 0  # try every step
        drafted = engine.generate(prompts, params)
        assert [r.token_ids for r in drafted] == [r.token_ids for r in plain]
        for a, b in zip(drafted, plain, strict=True):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs))
        assert engine.stats().speculation.verifications > 0
