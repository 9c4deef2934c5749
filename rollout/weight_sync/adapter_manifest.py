"""What a LoRA adapter sync carries: per module, its two rank-r factors and its scaling.

The factors travel like any weights, as `<module>.lora_A` [r, in_features] and
`<module>.lora_B` [out_features, r], always in float32 (an adapter is about 1% of a model, and
the merge `base + scaling * B @ A` wants them exact). Every engine checks the manifest against
its model before any tensor moves: each module must have a `.weight` of shape
[out_features, in_features].
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rollout.weight_sync.manifest import DEFAULT_BUCKET_BYTES, WeightManifest, manifest_for

LoraAdapter = Iterable[tuple[str, torch.Tensor, torch.Tensor, float]]
"""(module name, lora_A [r, in], lora_B [out, r], scaling = alpha / r) per adapted module."""

ADAPTER_DTYPE = torch.float32


@dataclass(frozen=True)
class AdapterManifest:
    modules: tuple[str, ...]
    """The engine model's module names whose `.weight` the adapter changes."""
    scalings: tuple[float, ...]
    """Each module's alpha / r, in the order of `modules`."""
    factors: WeightManifest
    """The tensors that travel: `<module>.lora_A` then `<module>.lora_B`, module by module."""

    def factor_names(self, module: str) -> tuple[str, str]:
        return f"{module}.lora_A", f"{module}.lora_B"

    def weight_shape(self, k: int) -> tuple[int, int]:
        """[out_features, in_features] of module k's weight, as its factors imply."""
        (_, in_features), (out_features, _) = self.factors.shapes[2 * k : 2 * k + 2]
        return out_features, in_features


def adapter_manifest_for(
    adapter: LoraAdapter, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> tuple[AdapterManifest, list[tuple[str, torch.Tensor]]]:
    """The adapter's manifest, and its factors as (name, tensor) pairs in the manifest's order.
    Raises ValueError naming a module whose factors do not fit together."""
    modules, scalings, named = [], [], []
    for module, lora_a, lora_b, scaling in adapter:
        if lora_a.dim() != 2 or lora_b.dim() != 2 or lora_a.shape[0] != lora_b.shape[1]:
            raise ValueError(
                f"adapter for {module}: lora_A must be [r, in_features] and lora_B "
                f"[out_features, r]; got {list(lora_a.shape)} and {list(lora_b.shape)}"
            )
        if not math.isfinite(scaling):
            raise ValueError(f"adapter for {module}: scaling is {scaling}")
        if module in modules:
            raise ValueError(f"adapter: module {module} is listed twice")
        modules.append(module)
        scalings.append(float(scaling))
        named += [(f"{module}.lora_A", lora_a), (f"{module}.lora_B", lora_b)]
    if not modules:
        raise ValueError("adapter: no module to sync")
    factors = manifest_for(named, ADAPTER_DTYPE, bucket_bytes)
    return AdapterManifest(tuple(modules), tuple(scalings), factors), named


def check_adapter(model: torch.nn.Module, manifest: AdapterManifest) -> None:
    """Raise ValueError naming every module the model lacks or shapes differently."""
    params = dict(model.named_parameters())
    missing = [m for m in manifest.modules if f"{m}.weight" not in params]
    wrong = []
    for k, module in enumerate(manifest.modules):
        weight = params.get(f"{module}.weight")
        if weight is not None and tuple(weight.shape) != manifest.weight_shape(k):
            wrong.append(
                f"{module}: adapter is for {list(manifest.weight_shape(k))}, engine weight is "
                f"{list(weight.shape)}"
            )
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"no such module with a .weight in the rollout model: {missing[:8]}")
        if wrong:
            parts.append(f"shape mismatch: {wrong[:8]}")
        raise ValueError(
            "adapter sync refused (" + "; ".join(parts) + "); the rollout weights are unchanged"
        )
