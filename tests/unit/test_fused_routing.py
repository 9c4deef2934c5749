"""The fused softmax routers: which routers are taken, and the twin against each class's own
forward (so a transformers release that changed one fails here). The Triton kernel itself is
checked against the twin by Triton's interpreter (tests/triton_interpreter_check.py) and on the
GPU (tests/gpu/test_moe_gpu.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rollout.engine.model.fused_routing import (
    fused_router_forward,
    fused_routers_selected,
    router_code,
    select_fused_routers,
)
from rollout.kernels.torch_moe import top_k_routing_reference
from tests.model_zoo import tiny_model

FAMILIES = ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral"]


def _routers(model_type: str, **overrides) -> list[torch.nn.Module]:
    model = tiny_model(model_type, num_experts=12, num_local_experts=12, **overrides)
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_twin_is_each_routers_own_code(model_type: str, norm_topk_prob: bool) -> None:
    routers = _routers(model_type, norm_topk_prob=norm_topk_prob, num_experts_per_tok=3)
    assert routers and all(router_code(r) is not None for r in routers)
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        for router in routers:
            router = router.to(dtype)
            x = torch.randn(2, 7, router.hidden_dim, generator=g).to(dtype)
            with torch.no_grad():
                want_logits, want_weights, want_index = router(x)
                logits, weights, index = fused_router_forward(router, x)  # the twin on CPU
            assert torch.equal(logits, want_logits)
            assert torch.equal(index, want_index)
            assert weights.dtype == want_weights.dtype
            torch.testing.assert_close(weights, want_weights, rtol=0, atol=0)


def test_the_twin_renormalizes_and_casts_as_asked() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    weights, index = top_k_routing_reference(logits, 2, True, torch.bfloat16)
    assert index.tolist() == [[1, 2]] and weights.dtype == torch.bfloat16
    probs = F.softmax(logits, -1)[0, [1, 2]]
    torch.testing.assert_close(weights.float()[0], (probs / probs.sum()).bfloat16().float())
    weights, _ = top_k_routing_reference(logits, 2, False, torch.float32)
    torch.testing.assert_close(weights[0], probs)


@pytest.mark.parametrize("model_type", ["gpt_oss", "llama", "deepseek_v3"])
def test_other_routers_keep_their_code(model_type: str) -> None:
    assert select_fused_routers(tiny_model(model_type)) == []


def test_a_subclass_is_not_taken() -> None:
    router = _routers("qwen3_moe")[0]

    class Biased(type(router)):
        pass

    router.__class__ = Biased
    assert router_code(router) is None


def test_selected_only_inside_and_restored_after() -> None:
    model = tiny_model("qwen3_moe")
    routers = select_fused_routers(model)
    assert len(routers) == model.config.num_hidden_layers
    own = [type(m).forward for m, _ in routers]
    with fused_routers_selected(routers):
        assert all(m.forward is forward for m, forward in routers)
    assert all("forward" not in vars(m) for m, _ in routers)
    assert [m.forward.__func__ for m, _ in routers] == own


def test_a_router_with_another_forward_override_is_left_alone() -> None:
    model = tiny_model("qwen3_moe")
    first = next(m for m in model.modules() if router_code(m) is not None)
    first.forward = first.forward  # someone else's instance-level override
    assert first not in [m for m, _ in select_fused_routers(model)]
