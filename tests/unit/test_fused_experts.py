"""The fused MoE experts path: which models it takes, and its twin against transformers' experts.

The Triton kernel itself is checked against the twin on CPU by Triton's interpreter
(tests/triton_interpreter_check.py) and on the GPU (tests/gpu/test_moe_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from rollout.engine.model.fused_experts import (
    EXPERTS_NAME,
    experts_modules,
    fused_experts_selected,
    select_fused_experts,
)
from rollout.kernels.torch_moe import fused_experts_reference, sort_by_expert
from tests.model_zoo import tiny_model

SUPPORTED = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"]


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_the_twin_equals_transformers_experts(model_type: str) -> None:
    model = tiny_model(model_type)
    configs, declined = select_fused_experts(model)
    assert declined is None and configs, declined
    g = torch.Generator().manual_seed(1)
    for module in experts_modules(model):
        tokens, top_k = 37, model.config.num_experts_per_tok
        num_experts = module.gate_up_proj.shape[0]
        x = torch.randn(tokens, module.gate_up_proj.shape[2], generator=g)
        logits = torch.randn(tokens, num_experts, generator=g)
        weights, index = torch.softmax(logits, -1).topk(top_k, dim=-1)
        with torch.no_grad():
            want = module(x, index, weights)
            got = fused_experts_reference(x, index, weights, module.gate_up_proj, module.down_proj)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_model_with_its_own_gate_keeps_transformers_path() -> None:
    configs, declined = select_fused_experts(tiny_model("gpt_oss"))
    assert configs == [] and "GptOssExperts" in declined


def test_a_dense_model_has_nothing_to_select() -> None:
    assert select_fused_experts(tiny_model("llama")) == ([], None)


def test_selected_only_inside_and_restored_after() -> None:
    model = tiny_model("qwen3_moe")
    before = model.config._experts_implementation
    configs, _ = select_fused_experts(model)
    with fused_experts_selected(configs):
        assert model.config._experts_implementation == EXPERTS_NAME
    assert model.config._experts_implementation == before


def test_sort_by_expert_groups_pairs_and_counts_unpicked_experts() -> None:
    index = torch.tensor([[2, 0], [2, 3], [0, 2]])
    order, counts, starts = sort_by_expert(index, num_experts=5)
    assert counts.tolist() == [2, 0, 3, 1, 0]
    assert starts.tolist() == [0, 2, 2, 5, 6]
    flat = index.reshape(-1)
    assert flat[order.long()].tolist() == [0, 0, 2, 2, 2, 3]
    assert order.tolist() == [1, 4, 0, 2, 5, 3]  # stable: pairs of one expert in token order
