"""Shared fixtures: tiny random transformers models (no downloads) and a tiny word tokenizer."""

from __future__ import annotations

import pytest
import torch

from rollout.process_env import set_process_env_defaults

set_process_env_defaults()

VOCAB = 96
EOS = 2


def tiny_model(arch: str, seed: int = 0, eos_token_id: int | None = None, **sizes):
    """A 2-layer random model of the given architecture, fp32, eval mode; `sizes` override its
    config's (hidden_size=256, say)."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),
        "qwen3_moe": (
            Qwen3MoeConfig,
            Qwen3MoeForCausalLM,
            {
                "head_dim": 16,
                "moe_intermediate_size": 32,
                "num_experts": 8,
                "num_experts_per_tok": 2,
            },
        ),
    }
    config_class, model_class, extra = classes[arch]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**common, **extra, **sizes})).eval()
    # Larger logits than the default init: sampled tokens then differ clearly between seeds.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id if eos_token_id is not None else 0
    return model


def near_tie_moe(seed: int = 0, spread: float = 3e-7, eos_token_id: int | None = None):
    """A tiny Qwen3-MoE whose experts' router rows differ by `spread` (relative): every token's
    top-2 is decided by differences near fp32's rounding, and its experts differ strongly."""
    model = tiny_model("qwen3_moe", seed=seed, eos_token_id=eos_token_id)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.gate.weight  # [experts, hidden]
            base = torch.randn(1, w.shape[1], generator=g)
            w.copy_(base + spread * base.abs() * torch.randn(w.shape, generator=g))
            experts = layer.mlp.experts
            experts.gate_up_proj.mul_(4.0)
    return model


def tiny_tokenizer():
    """A whitespace word-level tokenizer over VOCAB words (w0 .. w{VOCAB-1}); w2 is EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab["w1"] = 1
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="w0", eos_token=f"w{EOS}")


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    """A saved tiny Llama (EOS = w2) with the word tokenizer: a policy the GRPO job can load."""
    path = tmp_path_factory.mktemp("tiny-policy")
    tiny_model("llama", seed=5, eos_token_id=EOS).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def moe_policy_dir(tmp_path_factory) -> str:
    """The same with a tiny Qwen3-MoE (8 experts, top-2)."""
    path = tmp_path_factory.mktemp("tiny-moe-policy")
    tiny_model("qwen3_moe", seed=5, eos_token_id=EOS).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def near_tie_moe_dir(tmp_path_factory) -> str:
    """A tiny Qwen3-MoE policy whose routers nearly tie (`near_tie_moe`)."""
    path = tmp_path_factory.mktemp("near-tie-moe-policy")
    near_tie_moe(seed=5, eos_token_id=EOS).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> str:
    """A JSONL dataset of 12 word prompts with answers, in the job's `prompt` column format."""
    import json

    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    rows = [{"prompt": f"w{3 + i} w{10 + i} w{20 + i}", "answer": str(i % 5)} for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def random_prompts(lengths, seed: int = 0, low: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, VOCAB, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own generate, greedy, one prompt at a time (no padding effects)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def engine_for(model, settings: dict, tokenizer=None, **overrides):
    """An LLMEngine over a copy of `model` (the test keeps its own, unwrapped): a test file's
    `settings`, then the case's `overrides`."""
    import copy

    from rollout import EngineConfig, LLMEngine

    config = EngineConfig(**{**settings, **overrides})
    return LLMEngine.from_model(copy.deepcopy(model), config, tokenizer)


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `gpu` skip without CUDA (and must be run on the GPU machine)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run `pytest -m gpu` on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
