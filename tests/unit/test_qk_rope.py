"""Qwen3's q/k norms and rotary as one op (`rollout::qk_norm_rope`): routed only where the
model's own modules compute the op's twin, bit for bit, and the engine stays exact through it."""

from __future__ import annotations

import copy

import pytest
import torch

from rollout import SamplingParams
from rollout.engine.model.fused_projections import fuse_projections
from rollout.engine.model.fused_qk_rope import route_qk_rope
from tests import model_zoo
from tests.conftest import tiny_model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _must_not_run(*args, **kwargs):
    raise AssertionError("the module's own norm ran")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routed_op_gives_the_modules_own_values(arch: str, dtype: torch.dtype) -> None:
    model = tiny_model(arch).to(dtype)
    routed = copy.deepcopy(model)
    fuse_projections(routed)
    assert route_qk_rope(routed, True) == model.config.num_hidden_layers
    for layer in routed.model.layers:  # prove the op ran: the modules' own norms now fail
        layer.self_attn.q_norm.forward = layer.self_attn.k_norm.forward = _must_not_run
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    assert torch.equal(_logits(routed, ids), _logits(model, ids))


def test_only_the_known_norms_that_compute_the_twin_are_routed() -> None:
    llama = tiny_model("llama")  # no q/k norms
    fuse_projections(llama)
    assert route_qk_rope(llama, True) == 0

    qwen3 = tiny_model("qwen3")
    fuse_projections(qwen3)
    assert route_qk_rope(qwen3, True) == 2
    assert route_qk_rope(qwen3, False) == 0  # a later engine with the option off: unrouted
    assert not any(layer.self_attn._qk_rope for layer in qwen3.model.layers)

    # A norm of the same class computing something else (1 + weight, Gemma's form): the probe
    # sees it and that layer keeps its modules.
    changed = tiny_model("qwen3")
    fuse_projections(changed)
    norm = changed.model.layers[1].self_attn.k_norm
    plain = norm.forward
    norm.forward = lambda x: plain(x) + x
    assert route_qk_rope(changed, True) == 1
    assert [layer.self_attn._qk_rope for layer in changed.model.layers] == [True, False]


@pytest.mark.parametrize("fused_qk_rope", [True, False])
def test_engine_greedy_equals_generate(fused_qk_rope: bool) -> None:
    model = model_zoo.tiny_model("qwen3")
    engine = model_zoo.engine_for(model, fused_qk_rope=fused_qk_rope)
    attn = engine.model.model.layers[0].self_attn
    assert attn._qk_rope is fused_qk_rope
    prompts = model_zoo.prompts()
    outputs = engine.generate(prompts, SamplingParams(max_tokens=model_zoo.MAX_NEW, temperature=0))
    assert [r.token_ids for r in outputs] == [model_zoo.hf_greedy(model, p) for p in prompts]


@pytest.mark.parametrize("fused_qk_rope", [True, False])
def test_each_layer_writes_its_keys_and_values_once_a_step(fused_qk_rope: bool) -> None:
    """Routed, the op writes the layer's keys and values into the cache and the attention
    does not write them again; unrouted, the attention writes them. Either way greedy equals
    transformers (a write left out would change the tokens)."""
    model = model_zoo.tiny_model("qwen3")
    engine = model_zoo.engine_for(model, fused_qk_rope=fused_qk_rope)
    backend = engine.debug_internals().runner.backend
    calls = {"write_kv": 0, "attend": 0}
    for name in calls:
        original = getattr(backend, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(backend, name, counted)
    prompts = model_zoo.prompts()
    outputs = engine.generate(prompts, SamplingParams(max_tokens=model_zoo.MAX_NEW, temperature=0))
    assert [r.token_ids for r in outputs] == [model_zoo.hf_greedy(model, p) for p in prompts]
    assert calls["write_kv"] == calls["attend"] > 0
