"""`trainer.lora.target_modules` against the model's layers, checked before any work.

The model is built on the meta device from the config the trainer loads it with (no weights
read, seconds even for billions of parameters). A listed entry names a layer the way PEFT
matches it: the layer's full name is the entry, or ends in "." + entry. Each entry must name at
least one linear layer, and none may name the output head (TRL's AsyncGRPO computes logprobs
from the head's base weight and would ignore its adapter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from trainers.job.config_trainer import LoraSettings

_SUFFIXES_SHOWN = 8


def meta_model(model_path: str) -> nn.Module:
    """The causal LM of `model_path`'s config, its parameters on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def lora_target_problem(settings: LoraSettings, model: nn.Module, model_name: str) -> str | None:
    """What is wrong with the targets for this model, in one line (None: nothing)."""
    key = "trainer.lora.target_modules"
    head = _output_head_name(model)
    linear = [name for name in _linear_layer_names(model) if name != head]
    suffixes = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in linear))
    shown = ", ".join(suffixes[:_SUFFIXES_SHOWN]) + (
        ", ..." if len(suffixes) > _SUFFIXES_SHOWN else ""
    )
    if settings.target_modules == "all-linear":
        if not linear:
            return (
                f"{key}=all-linear: {model_name} has no linear layer besides its output head; "
                "list the modules to adapt"
            )
        return None
    entries = settings.target_modules
    on_head = [entry for entry in entries if head is not None and _matches(head, entry)]
    if on_head:
        return (
            f"{key}: [{', '.join(on_head)}] names {head}, the output head of {model_name}: TRL's "
            "AsyncGRPO computes logprobs from its base weight and would ignore the adapter; "
            "leave it out"
        )
    missing = [entry for entry in entries if not any(_matches(name, entry) for name in linear)]
    if missing:
        return (
            f"{key}: [{', '.join(missing)}] matches no linear layer of {model_name}; its linear "
            f"layers end in {shown}"
        )
    return None


def _matches(name: str, entry: str) -> bool:
    """PEFT's rule for a list of target modules: the full name, or a dotted suffix of it."""
    return name == entry or name.endswith("." + entry)


def _linear_layer_names(model: nn.Module) -> list[str]:
    """Layers PEFT's LoRA adapts as linear ones: nn.Linear, and transformers' Conv1D (GPT-2's
    projections, a linear layer with its weight transposed)."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear | Conv1D)]


def _output_head_name(model: nn.Module) -> str | None:
    head = model.get_output_embeddings()
    return next((name for name, m in model.named_modules() if m is head), None)
