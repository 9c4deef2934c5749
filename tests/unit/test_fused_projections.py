"""Fused q/k/v and gate/up: same outputs, same parameter names, weight copies reach the fused GEMM."""

from __future__ import annotations

import copy

import pytest
import torch

from rollout.engine.model.fused_projections import fuse_projections
from tests import model_zoo
from tests.conftest import tiny_model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_model_matches_and_keeps_names(arch: str) -> None:
    model = tiny_model(arch)
    fused = copy.deepcopy(model)
    assert fuse_projections(fused) == 2 * model.config.num_hidden_layers
    before = {n: p.shape for n, p in model.named_parameters()}
    assert {n: p.shape for n, p in fused.named_parameters()} == before
    assert fused.state_dict().keys() == model.state_dict().keys()  # fused buffers not persistent
    for layer in fused.model.layers:  # prove the fused path ran: the unfused one now fails
        layer.self_attn._unfused_forward = layer.mlp._unfused_forward = _must_not_run
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    torch.testing.assert_close(_logits(fused, ids), _logits(model, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_moe_models_fuse_their_attention(model_type: str) -> None:
    # Their MLP is the experts block (not fused here); their attention is the dense forward.
    model = model_zoo.tiny_model(model_type)
    if model_type == "mixtral":  # a window shorter than the prompt: it must still be applied
        model.config.sliding_window = 5
    fused = copy.deepcopy(model)
    assert fuse_projections(fused) == model.config.num_hidden_layers
    assert {n: p.shape for n, p in fused.named_parameters()} == {
        n: p.shape for n, p in model.named_parameters()
    }
    for layer in fused.model.layers:
        layer.self_attn._unfused_forward = _must_not_run
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    torch.testing.assert_close(_logits(fused, ids), _logits(model, ids), rtol=1e-5, atol=1e-5)


def _must_not_run(*args, **kwargs):
    raise AssertionError("the unfused forward ran")


def test_qwen2_biases_are_fused_too() -> None:
    model = tiny_model("qwen2")
    fuse_projections(model)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_bias is not None
    assert attn.k_proj.bias.data_ptr() == attn.qkv_bias[attn.qkv_sizes[0] :].data_ptr()


def test_copy_into_named_parameter_reaches_fused_weight() -> None:
    # Weight sync copies by name, in place: the fused forward must see the new values.
    model, reference = tiny_model("llama", seed=0), tiny_model("llama", seed=5)
    fuse_projections(model)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in reference.named_parameters():
            params[name].copy_(value)
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    torch.testing.assert_close(_logits(model, ids), _logits(reference, ids), rtol=1e-5, atol=1e-5)


def test_gradients_still_reach_the_named_parameters() -> None:
    model = tiny_model("llama")
    for p in model.parameters():
        p.requires_grad_(True)
    fuse_projections(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 7))
    model(input_ids=ids).logits.sum().backward()
    layer = model.model.layers[0]
    for lin in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp.up_proj):
        assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


def test_fusing_twice_is_a_no_op() -> None:
    model = tiny_model("qwen3")
    fuse_projections(model)
    assert fuse_projections(model) == 0
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    _logits(model, ids)  # no recursion through a doubly wrapped forward


def test_generate_with_transformers_cache_uses_the_unfused_path() -> None:
    model = tiny_model("llama")
    fused = copy.deepcopy(model)
    fuse_projections(fused)
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    kwargs = dict(max_new_tokens=8, do_sample=False)
    assert fused.generate(ids, **kwargs).tolist() == model.generate(ids, **kwargs).tolist()


def test_eager_attention_runs_the_module_own_forward() -> None:
    model = tiny_model("llama")
    model.set_attn_implementation("eager")
    fused = copy.deepcopy(model)
    fuse_projections(fused)
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    torch.testing.assert_close(_logits(fused, ids), _logits(model, ids), rtol=1e-5, atol=1e-5)
