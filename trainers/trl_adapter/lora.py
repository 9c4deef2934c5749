"""LoRA on the trainer's model through PEFT: its config from `trainer.lora`, the adapters as the
rollout actors need them for a weight sync, and the final model with the adapters merged in.

A LoRA layer computes `base(x) + scaling * B(A(x))`, so the weight it stands for is
`W + scaling * B @ A` (A: [r, in], B: [out, r]). A sync sends A, B and scaling per layer (r x
(in + out) numbers instead of in x out); the receiver folds them into the base weight it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import peft
    import torch
    from torch import nn

    from trainers.job.config_trainer import LoraSettings

# Where PeftModel keeps the transformers model it wraps, as a prefix of every module's name.
_PEFT_PREFIX = "base_model.model."


def peft_config_for(settings: LoraSettings) -> peft.LoraConfig:
    """PEFT's LoraConfig for the job's `trainer.lora` (a causal LM; biases stay frozen)."""
    from peft import LoraConfig, TaskType

    targets = settings.target_modules
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=settings.r,
        lora_alpha=settings.effective_alpha,
        lora_dropout=settings.dropout,
        # "all-linear" is PEFT's own keyword (every linear layer but the output head).
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",
    )


def adapter_for_sync(model: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor, float]]:
    """Every LoRA layer of the active adapter as (name in the unwrapped transformers model,
    A [r, in], B [out, r], scaling), detached, in the model's module order.

    NOTE: under FSDP2 the adapter weights are DTensor shards and `full_tensor()` is a collective:
    every rank must call this together, and the fixed module order keeps their gathers in step.
    """
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    assert isinstance(adapter, str), f"one active adapter expected, got {adapter!r}"
    layers = []
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or adapter not in module.lora_A:
            continue
        assert name.startswith(_PEFT_PREFIX), f"{name} is not under a PeftModel's base model"
        lora_a = _full(module.lora_A[adapter].weight)  # [r, in]
        lora_b = _full(module.lora_B[adapter].weight)  # [out, r]
        layers.append((name.removeprefix(_PEFT_PREFIX), lora_a, lora_b, module.scaling[adapter]))
    return layers


def _full(weight: torch.Tensor) -> torch.Tensor:
    """The whole tensor, detached: gathered from every rank when FSDP2 shards it."""
    from torch.distributed.tensor import DTensor

    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    return weight.detach()


def save_merged_model(
    adapter_dir: str | Path, base_model_path: str | Path, out_dir: str | Path, dtype
) -> None:
    """A plain transformers model in `out_dir`: the base model (loaded on CPU in `dtype`, a
    torch.dtype or its name) with the adapter saved in `adapter_dir` merged into its weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=dtype, device_map="cpu")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
