"""Decoder layers whose norms round their outputs, for FP8 activations
(EngineConfig.activation_quantization).

Under FP8 activations each projection reads its input rounded to e4m3 (fp8_linear.fp8_linear
rounds it there). For q/k/v and gate/up that input is a norm's output, so rounding it inside the
norm costs nothing more than the norm: `triton_rounded_rows` writes the rounded rows in the
activations' dtype and as e4m3 with their scales, in the norm's one pass. The layer's forward
here is transformers' Llama-family forward (residual, input norm, attention, residual add,
post-attention norm, MLP, residual add) with those two norms (the second with the residual add
before it) in one kernel each, the rounded rows handed to our fused attention and MLP forwards
(`fused_projections`), which pass them to their projections instead of rounding again; and the
last residual add in the down projection's GEMM (its kernel's last step, the same bits as an
add after it).

Only layers of the classes below, with RMSNorms of the classes below and whose attention and MLP
run our fused forwards, are changed; any other layer keeps its own forward, and its projections
round their inputs themselves (the same model: rounding a rounded row gives it back).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from rollout.engine.model.fp8_linear import reads_fp8_form_only
from rollout.engine.model.loader import decoder_layers
from rollout.kernels import triton_rounded_rows  # noqa: F401 - registers the rounding norms' ops

# transformers classes whose forward is the one described above, line for line
_LAYER_CLASSES = {
    "LlamaDecoderLayer",
    "MistralDecoderLayer",
    "Qwen2DecoderLayer",
    "Qwen3DecoderLayer",
}
# ... and whose norms compute weight * (h * rsqrt(mean(h^2) + eps)).to(h.dtype) in fp32
_NORM_CLASSES = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def round_layer_inputs(model: nn.Module, input_scales: str) -> int:
    """Give every eligible decoder layer the rounding forward (inputs rounded with a scale per
    row, "row", or per 128 inputs, "group"); returns how many layers changed."""
    if input_scales not in ("row", "group"):
        raise ValueError(f"round_layer_inputs: 'row' or 'group'; got {input_scales!r}")
    changed = 0
    for layer in _layers_or_none(model):
        if not _eligible(layer):
            continue
        if not hasattr(layer, "_unrounded_forward"):
            layer._unrounded_forward = layer.forward
        layer._grouped_inputs = input_scales == "group"
        layer.forward = types.MethodType(_rounding_layer_forward, layer)
        changed += 1
    return changed


def clear_rounded_layers(model: nn.Module) -> None:
    """Give every layer its own forward back (an engine without FP8 activations over a model an
    earlier engine changed)."""
    for layer in _layers_or_none(model):
        if hasattr(layer, "_unrounded_forward"):
            del layer._unrounded_forward
            vars(layer).pop("forward", None)


def _layers_or_none(model: nn.Module) -> list[nn.Module]:
    try:
        return decoder_layers(model, setting="activation_quantization")
    except ValueError:
        return []


def _eligible(layer: nn.Module) -> bool:
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return (
        type(layer).__name__ in _LAYER_CLASSES
        and type(getattr(layer, "input_layernorm", None)).__name__ in _NORM_CLASSES
        and type(getattr(layer, "post_attention_layernorm", None)).__name__ in _NORM_CLASSES
        and hasattr(attention, "_unfused_forward")  # fused_projections' forwards
        and hasattr(mlp, "_unfused_forward")
        and getattr(attention, "_fp8_qkv", None) is not None  # FP8: quantize_model ran
        and getattr(mlp, "_fp8_gate_up", None) is not None
    )


def _rounding_layer_forward(self, hidden_states: torch.Tensor, *args, **kwargs):
    # Training, or transformers' own KV cache (generate; `cache`, `past_key_values` before
    # transformers 5.25): the layer's own forward, whose projections round their inputs
    # themselves. Everything else goes to the attention, as the layer's own forward passes it.
    if (
        args
        or torch.is_grad_enabled()
        or kwargs.get("cache") is not None
        or kwargs.get("past_key_values") is not None
    ):
        return self._unrounded_forward(hidden_states, *args, **kwargs)
    grouped, norm = self._grouped_inputs, self.input_layernorm
    # the rounded rows in the activations' dtype only where a projection reads them (prefill)
    with_rows = not reads_fp8_form_only(hidden_states)
    residual = hidden_states
    normed, q, scale = torch.ops.rollout.rms_norm_rounded(
        hidden_states, norm.weight, norm.variance_epsilon, grouped, with_rows
    )
    attended, _ = self.self_attn(hidden_states=normed, rounded_input=(q, scale), **kwargs)
    norm = self.post_attention_layernorm
    residual, normed, q, scale = torch.ops.rollout.add_rms_norm_rounded(
        attended, residual, norm.weight, norm.variance_epsilon, grouped, with_rows
    )
    # the residual add in down's GEMM (its kernel's last step): one launch fewer a layer
    return self.mlp(normed, rounded_input=(q, scale), residual=residual)
