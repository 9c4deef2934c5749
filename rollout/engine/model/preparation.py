"""Everything the engine does to a transformers model before its first step, in one place.

In order: our paged attention registered with transformers; the MoE experts and the softmax
routers our kernels compute picked out (transformers' path for the rest); q/k/v and gate/up
fused into one GEMM each, and Qwen3's q/k norms and rotary into one op; with
`weight_quantization="fp8"`, the projections' and experts' weights rounded to their FP8 copies,
which the decode GEMMs read (`fp8_weights.py`); decode's projections routed to our decode GEMM;
the decoder layers compiled; with `record_routes`, each router's forward also writes the experts
it chose (`route_recording.py`). Fusing comes before compiling, because dynamo traces the fused
forward. Parameter names survive every change, so weight sync by name still works.

`PreparedModel.selected()` is the other half: inside it (one engine forward) the model runs our
implementations; outside it, its own, so a wrapped model's `model(ids)` is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from rollout.engine.config import EngineConfig
from rollout.engine.model.attention import paged_attention_selected, register_paged_attention
from rollout.engine.model.compilation import compile_decoder_layers
from rollout.engine.model.fp8_weights import INPUT_SCALES, Fp8Weights, clear_fp8, quantize_model
from rollout.engine.model.fused_experts import fused_experts_selected, select_fused_experts
from rollout.engine.model.fused_projections import fuse_projections, route_decode_linears
from rollout.engine.model.fused_qk_rope import route_qk_rope
from rollout.engine.model.fused_routing import fused_routers_selected, select_fused_routers
from rollout.engine.model.rounded_layers import clear_rounded_layers, round_layer_inputs
from rollout.engine.model.route_recording import RouteRecorder


@dataclass
class PreparedModel:
    """A model made ready for the engine's forwards, and what was chosen for it."""

    model: torch.nn.Module
    fused_experts_configs: list = field(default_factory=list)
    """The configs whose MoE experts run our fused kernel inside a step ([]: transformers')."""
    fused_experts_declined: str | None = None
    """Why an MoE model keeps transformers' experts path (None: fused, or not MoE)."""
    fused_routers: list = field(default_factory=list)
    """(router, our forward for it) for the softmax routers our routing kernel computes, or,
    when routes are recorded, for every router (the recording forward calls the kernel's)."""
    route_recorder: RouteRecorder | None = None
    """Where the routers write their choices inside a step (EngineConfig.record_routes)."""
    fp8_weights: Fp8Weights | None = None
    """The FP8 copies of the weights (EngineConfig.weight_quantization="fp8"); round them again
    after every weight change (`LLMEngine.update_weights` does)."""
    rounded_layers: int = 0
    """Decoder layers whose norms round their outputs (FP8 activations; rounded_layers.py)."""

    @contextmanager
    def selected(self) -> Iterator[None]:
        """Inside: our attention, and our experts and routers where they were picked."""
        with (
            paged_attention_selected(self.model),
            fused_experts_selected(self.fused_experts_configs),
            fused_routers_selected(self.fused_routers),
        ):
            yield


def prepare_model(
    model: torch.nn.Module, config: EngineConfig, device: torch.device, backend: str
) -> PreparedModel:
    """Prepare `model` in place for the engine's steps on `device` with the attention `backend`
    ("triton" or "torch": the Triton-only pieces need the Triton backend)."""
    register_paged_attention()
    prepared = PreparedModel(model)
    triton = backend == "triton"  # CUDA, with triton installed
    if config.fused_moe and triton:
        prepared.fused_experts_configs, prepared.fused_experts_declined = select_fused_experts(
            model
        )
    if config.fused_routing and triton:
        prepared.fused_routers = select_fused_routers(model)
    if config.record_routes:
        inner = {id(router): forward for router, forward in prepared.fused_routers}
        prepared.route_recorder = RouteRecorder(model, config.max_num_batched_tokens, device, inner)
        prepared.fused_routers = prepared.route_recorder.forwards
    if config.fuse_projections:
        fuse_projections(model)
    route_qk_rope(model, config.fused_qk_rope)  # unset by an earlier engine's choice too
    if config.weight_quantization == "fp8":  # after fusing: the fused weights get one copy each
        prepared.fp8_weights = quantize_model(
            model,
            keep_unrounded=config.fp8_keep_unrounded,
            lm_head=config.fp8_lm_head,
            activations=INPUT_SCALES[config.activation_quantization],
            head_input=config.fp8_lm_head_input,
        )
    else:
        clear_fp8(model)  # an earlier FP8 engine's copies would go stale here
    clear_rounded_layers(model)  # an earlier engine's, with other activation settings
    if (input_scales := INPUT_SCALES[config.activation_quantization]) is not None:
        prepared.rounded_layers = round_layer_inputs(model, input_scales)
    if config.triton_linear and triton:
        route_decode_linears(model)
    if config.compile_model and device.type == "cuda":
        compile_decoder_layers(model)
    return prepared
