"""New weights into a running engine's model, in place (`LLMEngine.update_weights`).

In place, because the CUDA graphs captured the parameters' storage: a copy into it keeps every
graph valid, a new tensor would not. The copies are queued on the compute stream, behind any
step still running there, so no step reads a half-written weight; and the prefix cache is
emptied first, since its KV was computed with the weights being replaced (a copy that fails
part-way leaves it stale too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class NonFiniteWeightsError(ValueError):
    """An update wrote NaN or infinity into the model's weights (a diverged training step): the
    engine refuses to run on them until an update with finite weights succeeds."""

    def __init__(self, message: str, names: list[str]) -> None:
        super().__init__(message)
        self.names = names
        """The weights that hold NaN or infinity."""


def name_some(names: list[str]) -> str:
    return f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"


def refuse_non_finite(named: Iterable[tuple[str, torch.Tensor]], what: str) -> None:
    """Raise NonFiniteWeightsError naming the tensors that hold NaN or infinity (one host sync
    for all of them)."""
    named = [(name, t) for name, t in named if t.is_floating_point()]
    finite = [torch.isfinite(t).all() for _, t in named]
    if finite and not bool(torch.stack(finite).all()):
        bad = [name for (name, _), ok in zip(named, finite, strict=True) if not ok]
        raise NonFiniteWeightsError(
            f"{what}: {len(bad)} weight(s) hold NaN or inf ({name_some(bad)}); a diverged "
            "training step? Check the trainer's loss and gradients, then update the weights "
            "again with finite ones",
            bad,
        )


def copy_by_name(model: torch.nn.Module, named_tensors: NamedTensors) -> None:
    """Copy each tensor into the model's parameter of that name (cast to its dtype). Every name,
    shape and value is checked first: a mismatch, NaN or infinity raises ValueError naming the
    tensor and copies nothing."""
    params = dict(model.named_parameters())
    pairs = list(named_tensors)
    unknown = [name for name, _ in pairs if name not in params]
    if unknown:
        raise ValueError(
            f"update_weights: {unknown[:8]} not among the model's parameters (names as in "
            "model.named_parameters()); nothing was copied"
        )
    wrong = [
        f"{name}: {list(t.shape)} for {list(params[name].shape)}"
        for name, t in pairs
        if tuple(t.shape) != tuple(params[name].shape)
    ]
    if wrong:
        raise ValueError(f"update_weights: shape mismatch {wrong[:8]}; nothing was copied")
    bad = [name for name, t in pairs if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ValueError(
            f"update_weights: {bad[:8]} hold NaN or infinity; nothing was copied (the model "
            "keeps its weights)"
        )
    with torch.no_grad():
        for name, tensor in pairs:
            params[name].copy_(tensor)


def update_weights(
    model: torch.nn.Module,
    streams,
    reset_prefix_cache: Callable[[], None],
    weights: NamedTensors | Callable[[torch.nn.Module], Any],
    after: Callable[[], Any] | None = None,
) -> Any:
    """`weights` as (name, tensor) pairs, or a function that copies into `model` in place (weight
    sync's receiver, bucket by bucket); returns what the function returns. `after` runs on the
    compute stream once the copies are queued, even when they failed part-way (FP8 weights are
    rounded again there, so the model stays one the engine serves exactly). The weights a
    function wrote are then checked for NaN and infinity (NonFiniteWeightsError); pairs are
    checked before anything is copied."""
    if isinstance(weights, torch.nn.Module):
        raise ValueError("update_weights takes (name, tensor) pairs: pass model.named_parameters()")
    reset_prefix_cache()
    with streams.on(streams.compute), torch.no_grad():
        try:
            if callable(weights):
                result = weights(model)
            else:
                result = copy_by_name(model, weights)  # checked before anything is copied
        finally:
            if after is not None:
                after()
        if callable(weights):  # what it wrote: every parameter, not only those `after` reads
            refuse_non_finite(model.named_parameters(), "update_weights")
    return result
