"""A LoRA adapter merged into the engine's weights: `weight = base + scaling * B @ A`.

The first adapter sync snapshots the base weight of every module it touches (the checkpoint's,
since a LoRA job never sends full weights), and every sync merges from that snapshot: version N
is applied exactly, never on top of version N - 1's rounding. With FP8 weights the snapshot is
taken from the engine's unrounded copies, so the merged weight is rounded once, as the trainer's
base plus adapter would be. The merge is computed in float32
and cast once to the weight's dtype, module by module, so only one module's temporaries exist at
a time. Later syncs must touch the same modules: a module left out would keep a stale delta.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rollout.weight_sync.adapter_manifest import AdapterManifest
from rollout.weight_sync.transfer import TornWeightsError


class AdapterMerge:
    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}
        """Module name -> a clone of its weight before any adapter ({}: no adapter merged yet)."""

    def check(self, manifest: AdapterManifest) -> None:
        """Raise ValueError naming the modules if `manifest` touches others than the snapshot's."""
        if not self.base:
            return
        added = [m for m in manifest.modules if m not in self.base]
        dropped = [m for m in self.base if m not in set(manifest.modules)]
        if added or dropped:
            raise ValueError(
                "adapter sync refused: it must change the same modules as the first adapter "
                f"sync (new: {added[:8]}, left out: {dropped[:8]}); the rollout weights are "
                "unchanged"
            )

    def forget_base(self) -> None:
        """New full weights came in: the next adapter sync snapshots them as its base."""
        self.base = {}

    def merge(
        self,
        model: torch.nn.Module,
        manifest: AdapterManifest,
        factors: dict[str, torch.Tensor],
        unrounded: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
    ) -> None:
        """Set each module's weight from its base and the received factors, in place. A failure
        after the first module raises TornWeightsError (the model mixes two versions).
        `unrounded(weight)`: an FP8 engine's values of a weight before rounding, the base to
        snapshot instead of the rounded weight (`Fp8Weights.unrounded`)."""
        self.check(manifest)
        weights = dict(model.named_parameters())
        if not self.base:
            self.base = {}
            for m in manifest.modules:
                weight = weights[f"{m}.weight"].detach()
                kept = unrounded(weight) if unrounded is not None else None
                self.base[m] = kept if kept is not None else weight.clone()
        done = 0
        try:
            with torch.no_grad():
                for module, scaling in zip(manifest.modules, manifest.scalings, strict=True):
                    name_a, name_b = manifest.factor_names(module)
                    lora_a, lora_b = factors[name_a].float(), factors[name_b].float()
                    merged = self.base[module].float() + scaling * (lora_b @ lora_a)  # [out, in]
                    weights[f"{module}.weight"].copy_(merged)
                    del merged
                    done += 1
        except Exception as err:
            if done:
                raise TornWeightsError(
                    f"the adapter merge broke after {done} of {len(manifest.modules)} modules: "
                    f"{err}"
                ) from err
            raise
