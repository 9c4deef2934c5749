"""The oracle of FP8 weights: a copy of a model whose projection and expert weights are their
FP8 values, chosen by parameter name (independently of the engine's own choice)."""

from __future__ import annotations

import copy

import torch

from rollout.kernels.torch_fp8 import dequantize_rows, quantize_rows


def expected_rounded(name: str, lm_head: bool = False) -> bool:
    """The decoder layers' projections and expert weights are FP8 (and the LM head with
    `lm_head`); embeddings, norms and routers (`mlp.gate`) are not."""
    if lm_head and name == "lm_head.weight":
        return True
    if ".layers." not in name:
        return False
    return name.endswith("_proj.weight") or name.endswith(
        ("experts.gate_up_proj", "experts.down_proj")
    )


def rounded_copy(
    model: torch.nn.Module, lm_head: bool = False, round_inputs: bool = False
) -> torch.nn.Module:
    """`model` with its FP8 weights; with `round_inputs`, each rounded projection of the decoder
    layers also rounds its input rows to e4m3 with a power-of-two scale each, as
    activation_quantization="fp8" serves it."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if expected_rounded(name, lm_head):
                param.copy_(dequantize_rows(*quantize_rows(param), param.dtype))
    if round_inputs:
        for name, module in rounded.named_modules():
            if isinstance(module, torch.nn.Linear) and expected_rounded(f"{name}.weight"):
                module.register_forward_pre_hook(_round_input)
    return rounded


def _round_input(module: torch.nn.Module, args: tuple) -> tuple:
    x = args[0]
    return (dequantize_rows(*quantize_rows(x), x.dtype), *args[1:])


FP8_KV_ATTENTION = "fp8_kv_sdpa"


def with_fp8_kv_attention(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose attention sees its keys and values rounded as the FP8 KV cache
    stores them (e4m3, a power-of-two scale per token and head), then runs transformers' SDPA:
    what an engine with kv_cache_dtype="fp8" computes."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    from rollout.kernels.torch_fp8 import quantize_kv

    def rounded(x: torch.Tensor) -> torch.Tensor:  # [batch, kv_heads, tokens, head_dim]
        q, scale = quantize_kv(x)
        return dequantize_rows(q, scale, x.dtype)

    def attention(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(
            module, query, rounded(key), rounded(value), attention_mask, **kwargs
        )

    AttentionInterface.register(FP8_KV_ATTENTION, attention)
    AttentionMaskInterface.register(FP8_KV_ATTENTION, sdpa_mask)
    copied = copy.deepcopy(model)
    copied.set_attn_implementation(FP8_KV_ATTENTION)
    return copied
