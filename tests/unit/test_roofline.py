"""The bandwidth floor of decode steps (benchmarks/lib/roofline.py), against hand-computed cases."""

from __future__ import annotations

import pytest

from benchmarks.lib.roofline import (
    H200_COPY_BANDWIDTH,
    expected_touched_experts,
    floor_bandwidth,
    per_step_floor,
    roofline_tokens_per_s,
    running_per_step,
    weight_bytes_per_step,
    weight_split,
)


def test_running_samples_per_step_are_those_longer_than_the_step() -> None:
    assert running_per_step([1, 3]).tolist() == [2, 1, 1]
    assert running_per_step([3, 0, 3, 2]).tolist() == [3, 3, 2]
    assert running_per_step([]).tolist() == []


def test_per_step_floor_of_unequal_lengths_with_a_window_layer() -> None:
    # Prompt 4, lengths 1 and 3; two layers, one full and one of window 2, 5 KV bytes per token
    # each; 100 bytes of weights; bandwidth 1 byte/s, so seconds are bytes.
    # Step 0, both running, contexts 4 and 4: full 4 + 4 = 8, window 2 + 2 = 4 -> 12 * 5 = 60.
    # Step 1, the long one alone, context 5: full 5, window 2 -> 35.  Step 2: 6 + 2 -> 40.
    seconds, total = per_step_floor(4, [1, 3], 100, 10, windows=(None, 2), bandwidth=1.0)
    assert seconds.tolist() == [160.0, 135.0, 140.0]
    assert total == 435.0


def test_per_step_floor_keeps_each_samples_own_prompt_length() -> None:
    # The shorter sample has the longer prompt: step 1 reads the other one's context (4 + 1).
    seconds, _ = per_step_floor([10, 4], [1, 2], 0, 1, bandwidth=1.0)
    assert seconds.tolist() == [14.0, 5.0]


def test_per_step_floor_reads_only_the_experts_a_step_touches() -> None:
    # 4 experts, top-2, 400 expert bytes (100 per expert over all layers), no KV.
    # Two tokens touch 4 * (1 - (1/2)^2) = 3 experts in expectation, one token exactly 2.
    seconds, total = per_step_floor(
        4, [1, 3], 100, 0, expert_bytes=400, num_experts=4, top_k=2, bandwidth=1.0
    )
    assert seconds.tolist() == pytest.approx([400.0, 300.0, 300.0])
    assert total == pytest.approx(1000.0)


def test_expected_touched_experts_under_uniform_routing() -> None:
    assert expected_touched_experts(128, 8, 1) == pytest.approx(8.0)
    assert expected_touched_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert expected_touched_experts(128, 8, 0) == 0.0
    assert expected_touched_experts(128, 8, 1024) == pytest.approx(128.0)
    assert expected_touched_experts(4, 4, 1) == 4.0  # every expert, every token


@pytest.mark.parametrize("windows", [None, (None,) * 4, (128, None, 128, None)])
def test_per_step_floor_of_equal_lengths_is_the_fixed_length_roofline(windows) -> None:
    weights, kv, seqs, prompt, new = 10**9, 131072, 32, 256, 300
    _, total = per_step_floor(prompt, [new] * seqs, weights, kv, windows=windows)
    expected = roofline_tokens_per_s(weights, kv, seqs, prompt, new, windows=windows)
    assert seqs * new / total == pytest.approx(expected, rel=1e-12)


def _tiny(config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config).eval()


def test_weight_split_finds_the_experts_of_a_qwen3_moe_model() -> None:
    from transformers import Qwen3MoeConfig

    model = _tiny(
        Qwen3MoeConfig(
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            vocab_size=128,
            tie_word_embeddings=False,
        )
    )
    split = weight_split(model)
    # Per layer: gate_up [8, 2 * 32, 64] and down [8, 64, 32], fp32.
    assert split.expert_bytes == 2 * (8 * 64 * 64 + 8 * 64 * 32) * 4
    assert (split.num_experts, split.top_k) == (8, 2)
    assert split.dense_bytes + split.expert_bytes == weight_bytes_per_step(model)
    assert split.dense_bytes > 0


def test_weight_split_counts_gpt_oss_expert_biases_and_its_local_experts() -> None:
    from benchmarks.lib.workloads import GPT_OSS_20B, model_config

    shape = dict(
        GPT_OSS_20B,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=128,
    )
    model = _tiny(model_config(shape))
    split = weight_split(model)
    experts = [
        p
        for name, p in model.named_parameters()
        if ".experts." in name  # gate_up_proj, down_proj and their biases
    ]
    assert split.expert_bytes == sum(p.numel() * p.element_size() for p in experts)
    assert (split.num_experts, split.top_k) == (4, 2)


def test_weight_split_of_a_dense_model_has_no_experts() -> None:
    from benchmarks.lib.workloads import TINY, model_config

    model = _tiny(model_config(TINY))
    # A dense MLP's down_proj is a Linear module, not a 3-D parameter: not an experts module.
    assert weight_split(model) == (weight_bytes_per_step(model), 0, 0, 0)


def test_the_floor_divides_by_the_h200_figure_on_an_h200_and_off_cuda(monkeypatch) -> None:
    import torch

    from benchmarks.lib import roofline

    monkeypatch.setattr(roofline, "measured_copy_bandwidth", lambda index: pytest.fail("measured"))
    assert floor_bandwidth("cpu")[0] == H200_COPY_BANDWIDTH
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert floor_bandwidth("cuda:0") == (H200_COPY_BANDWIDTH, "one H200's copy bandwidth")


def test_the_floor_divides_by_another_gpus_own_measured_bandwidth(monkeypatch) -> None:
    import torch

    from benchmarks.lib import roofline

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(roofline, "measured_copy_bandwidth", lambda index: 2.9e12 + index)
    bandwidth, what = floor_bandwidth("cuda:1")
    assert bandwidth == 2.9e12 + 1
    assert what == "NVIDIA H100 80GB HBM3's copy bandwidth, measured"
    # the floor scales with it: the same bytes take 4.24 / 2.9 as long
    _, h200_s = per_step_floor(100, [10, 20], 10**9, 1024)
    _, h100_s = per_step_floor(100, [10, 20], 10**9, 1024, bandwidth=bandwidth)
    assert h100_s / h200_s == pytest.approx(H200_COPY_BANDWIDTH / bandwidth)
