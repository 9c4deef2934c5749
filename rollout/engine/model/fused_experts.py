"""Our fused MoE experts kernel, plugged into transformers' MoE classes by name.

transformers (5.x) stores an MoE layer's experts as 3-D tensors and dispatches their forward by
`config._experts_implementation` at each call ("grouped_mm" by default). We register one more
implementation, `rollout_fused` (`rollout::fused_experts`, rollout/kernels/triton_moe.py), and
select it only inside an engine step, as the attention is: the modules and their parameter names
stay the model's own, so weight sync and the trainer's logprobs are unchanged, and outside a step
the model runs transformers' path again.

The kernel computes the SiLU-gated expert MLP with concatenated [gate; up] rows, no biases and
no per-expert norm: the layout of Qwen2/3-MoE, Mixtral, OLMoE and most others. A model with any
other experts module (gpt-oss's clamped gate with biases, transposed or ungated experts) keeps
transformers' path for all its layers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rollout.engine.model.implementation_switch import implementation_selected

EXPERTS_NAME = "rollout_fused"


def fused_experts_forward(
    module: torch.nn.Module,
    hidden_states: torch.Tensor,  # [num_tokens, hidden]
    top_k_index: torch.Tensor,  # [num_tokens, k]
    top_k_weights: torch.Tensor,  # [num_tokens, k]
) -> torch.Tensor:
    from rollout.kernels.triton_moe import fused_experts, fused_experts_fp8

    fp8_gate_up = getattr(module, "_fp8_gate_up_proj", None)  # fp8_weights.py
    if fp8_gate_up is not None:
        return fused_experts_fp8(
            hidden_states, top_k_index, top_k_weights, module.gate_up_proj, module.down_proj,
            *fp8_gate_up, *module._fp8_down_proj,
        )  # fmt: skip
    return fused_experts(
        hidden_states, top_k_index, top_k_weights, module.gate_up_proj, module.down_proj
    )


def experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that dispatch through transformers' experts interface."""
    return [m for m in model.modules() if hasattr(m, "is_concatenated") and hasattr(m, "has_gate")]


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why the fused kernel cannot compute this experts module exactly (None: it can)."""
    from transformers.activations import SiLUActivation
    from transformers.integrations.moe import _default_apply_gate

    name = type(module).__name__
    if not module.has_gate or not module.is_concatenated or module.is_transposed:
        return f"{name}: not the [gate; up] x [E, 2I, H] layout"
    if module.has_bias or getattr(module, "has_post_expert_norm", False):  # newer transformers only
        return f"{name}: expert biases or a per-expert norm"
    if type(module)._apply_gate is not _default_apply_gate:
        return f"{name}: its own gate function"
    if not isinstance(getattr(module, "act_fn", None), SiLUActivation | torch.nn.SiLU):
        return f"{name}: activation {type(getattr(module, 'act_fn', None)).__name__}, not SiLU"
    if getattr(module, "_is_expert_parallel", False):
        return f"{name}: expert parallel"
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return f"{name}: no gate_up_proj/down_proj tensors"
    if gate_up.dim() != 3 or down.dim() != 3 or down.shape[2] * 2 != gate_up.shape[1]:
        return f"{name}: expert weights of shapes {tuple(gate_up.shape)}, {tuple(down.shape)}"
    return None


def select_fused_experts(model: torch.nn.Module) -> tuple[list, str | None]:
    """(the configs to switch inside a step, why not when the model keeps its own path).
    No experts modules: ([], None)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    modules = experts_modules(model)
    if not modules:
        return [], None
    for module in modules:
        reason = unsupported_reason(module)
        if reason is not None:
            return [], reason
    ALL_EXPERTS_FUNCTIONS.register(EXPERTS_NAME, fused_experts_forward)
    configs = {id(m.config): m.config for m in modules}
    return list(configs.values()), None


@contextmanager
def fused_experts_selected(configs: list) -> Iterator[None]:
    """Inside: the experts modules of these configs run our kernel."""
    with implementation_selected(configs, "_experts_implementation", EXPERTS_NAME):
        yield
