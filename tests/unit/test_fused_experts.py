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

# Every family of the model sweep whose experts the fused kernel takes (transformers 5.24).
SUPPORTED = [
    "afmoe", "cohere2_moe", "dots1", "ernie4_5_moe", "exaone_moe", "flex_olmo", "glm4_moe",
    "granitemoe", "granitemoe_swa", "granitemoeshared", "hunyuan_v1_moe", "hy_v3", "laguna",
    "minimax_m2", "mixtral", "olmoe", "phimoe", "qwen2_moe", "qwen3_moe", "sarvam_moe",
    "solar_open",
]  # fmt: skip


def _top_k(config) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "num_experts_per_tok", None) or text.moe_topk


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_the_twin_equals_transformers_experts(model_type: str) -> None:
    model = tiny_model(model_type)
    configs, declined = select_fused_experts(model)
    assert declined is None and configs, declined
    g = torch.Generator().manual_seed(1)
    for module in experts_modules(model):
        tokens, top_k = 37, _top_k(model.config)
        num_experts = module.gate_up_proj.shape[0]
        x = torch.randn(tokens, module.gate_up_proj.shape[2], generator=g)
        logits = torch.randn(tokens, num_experts, generator=g)
        weights, index = torch.softmax(logits, -1).topk(top_k, dim=-1)
        with torch.no_grad():
            want = module(x, index, weights)
            got = fused_experts_reference(x, index, weights, module.gate_up_proj, module.down_proj)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("model_type", "why"),
    [("gpt_oss", "GptOssExperts: not the"), ("minimax_m3_vl_text", "its own gate function")],
)
def test_other_experts_keep_transformers_path(model_type: str, why: str) -> None:
    configs, declined = select_fused_experts(tiny_model(model_type))
    assert configs == [] and why in declined


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


def test_tile_choice_follows_programs_and_pairs_per_expert() -> None:
    """The tail tiles only while the pairs' 64-wide column blocks would not fill the SMs once
    (never off CUDA, where the SM count is 0), the prefill tiles from 512 pairs an expert in
    16-bit, and the decode tiles between."""
    from rollout.kernels import triton_moe

    bf16 = torch.bfloat16
    # Qwen3-30B-A3B's experts (768 wide: 12 column blocks) on 132 SMs.
    assert triton_moe.tiles(8, 128, bf16, 768, 132) == triton_moe.TAIL_TILES  # 96 programs
    assert triton_moe.tiles(16, 128, bf16, 768, 132)["BLOCK_N"] == 64  # 192 programs
    assert triton_moe.tiles(8, 128, bf16, 768, 0)["BLOCK_N"] == 64  # the interpreter
    assert triton_moe.tiles(8192 * 8, 128, bf16, 768, 132) == triton_moe.PREFILL_TILES
    assert triton_moe.tiles(8192 * 8, 128, torch.float32, 768, 132)["BLOCK_M"] == 64
    assert triton_moe.tiles(256, 128, bf16, 768, 132)["BLOCK_M"] == 16
