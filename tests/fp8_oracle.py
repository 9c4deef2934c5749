"""The oracle of FP8 weights: a copy of a model whose projection and expert weights are their
FP8 values, chosen by parameter name (independently of the engine's own choice)."""

from __future__ import annotations

import copy

import torch

from rollout.kernels.torch_fp8 import (
    dequantize_groups,
    dequantize_rows,
    quantize_groups,
    quantize_rows,
)


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
    model: torch.nn.Module,
    lm_head: bool = False,
    input_scales: str | None = None,
    head_input: bool = False,
) -> torch.nn.Module:
    """`model` with its FP8 weights; with `input_scales`, each rounded projection of the decoder
    layers also rounds its input to e4m3 with a power-of-two scale per row ("row", as
    activation_quantization="fp8" serves it) or per 128 inputs of a row ("group", as
    "fp8-group" does), and with `head_input` the LM head its own (fp8_lm_head_input)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if expected_rounded(name, lm_head):
                param.copy_(dequantize_rows(*quantize_rows(param), param.dtype))
    if input_scales is None:
        return rounded
    return with_rounded_inputs(rounded, input_scales, head_input)


def with_rounded_inputs(
    model: torch.nn.Module, input_scales: str, head_input: bool = False
) -> torch.nn.Module:
    """A copy of `model` whose every plain `nn.Linear` in the decoder layers but the routers
    (the projections activation_quantization covers, whatever their names) rounds its input
    ("row" or "group", as in `rounded_copy`), and the LM head with `head_input`. Its weights are
    left as they are: give it the engine's (`tests.model_zoo.with_weights_of`)."""
    from rollout.engine.model.fp8_weights import is_router
    from rollout.engine.model.loader import decoder_layers

    hook = {"row": _round_input_rows, "group": _round_input_groups}[input_scales]
    copied = copy.deepcopy(model)
    for layer in decoder_layers(copied, setting="activation_quantization"):
        for name, module in layer.named_modules():
            if type(module) is torch.nn.Linear and not is_router(name):
                module.register_forward_pre_hook(hook)
    if head_input:
        copied.get_output_embeddings().register_forward_pre_hook(hook)
    return copied


def _round_input_rows(module: torch.nn.Module, args: tuple) -> tuple:
    x = args[0]
    return (dequantize_rows(*quantize_rows(x), x.dtype), *args[1:])


def _round_input_groups(module: torch.nn.Module, args: tuple) -> tuple:
    x = args[0]
    return (dequantize_groups(*quantize_groups(x), x.dtype), *args[1:])


def wide_model_with_outliers(seed: int):
    """A tiny Qwen3 whose projections' inputs span two or three 128-wide groups (hidden 256,
    16 heads of 16, intermediate 384), as an LLM with massive activations: the first group of
    each norm's output 4096x the rest, and the projections' weights on it 4096x smaller, so the
    other groups still carry the outputs. Rounded with one scale a row, those groups' values
    fall to e4m3's subnormals; with a scale a group they keep their 3 bits."""
    from tests.conftest import tiny_model

    model = tiny_model(
        "qwen3", seed=seed, hidden_size=256, intermediate_size=384, num_attention_heads=16,
        num_key_value_heads=4,
    )  # fmt: skip
    with torch.no_grad():
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            for norm, projections in (
                (layer.input_layernorm, (attention.q_proj, attention.k_proj, attention.v_proj)),
                (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj)),
            ):
                norm.weight[:128] *= 4096
                for projection in projections:
                    projection.weight[:, :128] /= 4096
    return model


def with_fp8_kv_attention(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose attention sees its keys and values rounded as the FP8 KV cache
    stores them (e4m3, a power-of-two scale per token and head), then runs the model's own
    attention (its eager function, with whatever softcap, sinks or window it applies, or SDPA):
    what an engine with kv_cache_dtype="fp8" computes."""
    import sys

    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rollout.kernels.torch_fp8 import quantize_kv

    own = model.config._attn_implementation
    name = f"fp8_kv_{own}"

    def rounded(x: torch.Tensor) -> torch.Tensor:  # [batch, kv_heads, tokens, head_dim]
        q, scale = quantize_kv(x)
        return dequantize_rows(q, scale, x.dtype)

    def attention(module, query, key, value, attention_mask, **kwargs):
        if own == "eager":  # each modeling file has its own
            forward = sys.modules[type(module).__module__].eager_attention_forward
        else:
            forward = ALL_ATTENTION_FUNCTIONS[own]
        return forward(module, query, rounded(key), rounded(value), attention_mask, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[own])
    copied = copy.deepcopy(model)
    copied.set_attn_implementation(name)
    return copied
