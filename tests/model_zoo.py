"""Tiny random models of transformers' own decoder-only families, and the check that the engine
serves each one exactly like `generate` or refuses it at construction.

Used by tests/integration/test_model_families.py (the named families, in depth) and
tests/integration/test_model_sweep.py (every causal-LM family in transformers' auto mapping).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch

from rollout import EngineConfig, LLMEngine, SamplingParams
from rollout.engine.model.capabilities import UnsupportedModelError
from tests.fp8_oracle import with_fp8_kv_attention, with_rounded_inputs

VOCAB = 96
WINDOW = 8  # every sliding window: shorter than the longer prompts below
PROMPT_LENGTHS = (3, 11, 30)
MAX_NEW = 16
MAX_PARAMETERS = 30e6

# One small value for every name transformers' configs use for a size; each config gets the
# names it knows.
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    n_embd=64,
    d_model=64,
    num_hidden_layers=2,
    n_layer=2,
    num_layers=2,
    num_attention_heads=4,
    n_head=4,
    num_key_value_heads=2,
    intermediate_size=128,
    n_inner=128,
    ffn_dim=128,
    head_dim=16,
    max_position_embeddings=512,
    n_positions=512,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)


class CannotBuildSmall(Exception):
    """This family's config or model cannot be made small from generic settings."""


def tiny_config(model_type: str, **overrides):
    """The family's config with every size small, sliding windows of WINDOW tokens, and
    alternating sliding/full layers where the family has per-layer types."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    try:
        defaults = config_class()
    except Exception as err:  # noqa: BLE001 - recorded as the family's outcome
        raise CannotBuildSmall(f"config: {type(err).__name__}: {err}") from err
    known = set(defaults.to_dict())
    values = {name: value for name, value in SMALL.items() if name in known}
    for name in ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"):
        if hasattr(defaults, name):
            values[name] = {
                "sliding_window": WINDOW,
                "use_sliding_window": True,
                "max_window_layers": 1,  # Qwen2: layers from this index on use the window
                "layer_types": None,
            }[name]
    values.update(overrides)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = config_class(**values)
    except Exception as err:  # noqa: BLE001 - recorded as the family's outcome
        raise CannotBuildSmall(f"config: {type(err).__name__}: {err}") from err
    layer_types = getattr(config, "layer_types", None)
    if layer_types and "sliding_attention" in layer_types and "layer_types" not in overrides:
        config.layer_types = ["sliding_attention", "full_attention"] * (len(layer_types) // 2)
    return config


def tiny_model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, **overrides)
    if getattr(config, "is_encoder_decoder", False):
        raise CannotBuildSmall("an encoder-decoder model")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):  # count first: some sub-configs stay large
                size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if size > MAX_PARAMETERS:
                raise CannotBuildSmall(f"{size / 1e6:.0f}M parameters with these settings")
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config).eval()
    except CannotBuildSmall:
        raise
    except Exception as err:  # noqa: BLE001 - recorded as the family's outcome
        raise CannotBuildSmall(f"model: {type(err).__name__}: {err}") from err
    with torch.no_grad():  # larger logits: greedy choices are far from ties
        head = model.get_output_embeddings()
        if head is not None:
            head.weight.mul_(8.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompts(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def hf_greedy(model, prompt: list[int], max_new_tokens: int = MAX_NEW) -> list[int]:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            min_length=0,
        )
    return out[0, len(prompt) :].tolist()


def engine_for(model, overlap: bool = True, **overrides) -> LLMEngine:
    settings = dict(
        overlap=overlap,
        block_size=4,
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=12,  # < the longest prompt: chunked prefill
        num_kv_blocks=64,
        device="cpu",
        dtype="float32",
    )
    settings.update(overrides)
    return LLMEngine.from_model(copy.deepcopy(model), EngineConfig(**settings))


def with_weights_of(model: torch.nn.Module, source: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with `source`'s parameter values, by name."""
    copied = copy.deepcopy(model)
    values = dict(source.named_parameters())
    with torch.no_grad():
        for name, param in copied.named_parameters():
            param.copy_(values[name])
    return copied


@dataclass
class Outcome:
    family: str
    result: str  # "exact", "refused", "cannot be built small"; or a failure in capitals
    detail: str = ""
    verifications: int = 0  # with speculative="ngram": the steps that verified drafts

    @property
    def acceptable(self) -> bool:
        return self.result in ("exact", "refused", "cannot be built small")


def try_family(model_type: str, **engine_overrides) -> Outcome:
    """The family's outcome with the engine's defaults changed by `engine_overrides`. With
    weight_quantization="fp8" the oracle is the model with the engine's rounded weights (and with
    activation_quantization, its projections' inputs rounded too), with kv_cache_dtype="fp8"
    the model whose attention sees FP8-rounded keys and values: exact
    means the engine serves the FP8 model as transformers computes it."""
    try:
        model = tiny_model(model_type)
    except CannotBuildSmall as err:
        return Outcome(model_type, "cannot be built small", str(err))
    try:
        engine = engine_for(model, **engine_overrides)
    except UnsupportedModelError as err:
        return Outcome(model_type, "refused", str(err))
    except Exception as err:  # noqa: BLE001 - a refusal must say what to change, not crash
        return Outcome(model_type, "CRASH AT CONSTRUCTION", repr(err))
    if engine_overrides.get("weight_quantization", "none") != "none":
        model = with_weights_of(model, engine.model)
    activations = engine_overrides.get("activation_quantization", "none")
    if activations != "none":
        model = with_rounded_inputs(model, {"fp8": "row", "fp8-group": "group"}[activations])
    if engine_overrides.get("kv_cache_dtype", "auto") == "fp8":
        model = with_fp8_kv_attention(model)
    cases = prompts()
    try:
        expected = [hf_greedy(model, p) for p in cases]
    except Exception as err:  # noqa: BLE001 - transformers' own generate cannot run it
        return Outcome(model_type, "cannot be built small", f"generate: {err!r}")
    try:
        results = engine.generate(cases, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    except Exception as err:  # noqa: BLE001 - the failure this sweep exists to catch
        return Outcome(model_type, "LATE CRASH", repr(err))
    got = [r.token_ids for r in results]
    if got != expected:
        return Outcome(model_type, "DIFFERENT", f"engine {got} vs generate {expected}")
    # An FP8 cache rounds every key and value: a difference of fp32's last bits before it (the
    # order of a sum) can move one element to its neighbouring e4m3 value, ~5e-4 on a logprob.
    tolerance = 1e-3 if engine_overrides.get("kv_cache_dtype") == "fp8" else 1e-4
    for prompt, result in zip(cases, results, strict=True):
        worst = max_logprob_difference(model, prompt, result)
        if worst > tolerance:
            return Outcome(
                model_type, "DIFFERENT", f"logprobs {worst:.1e} from the model's (> {tolerance})"
            )
    verified = engine.stats().speculation.verifications
    return Outcome(model_type, "exact", type(model).__name__, verifications=verified)


def max_logprob_difference(model, prompt: list[int], result) -> float:
    """The largest gap between the engine's greedy logprobs and the model's own forward over the
    prompt and the engine's tokens."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logits = model(torch.tensor([prompt + result.token_ids], device=model.device)).logits
    logprobs = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    own = logprobs.gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
    return float((own - torch.tensor(result.logprobs)).abs().max())
