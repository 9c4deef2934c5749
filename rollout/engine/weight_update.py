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
    rounded again there, so the model stays one the engine serves exactly)."""
    if isinstance(weights, torch.nn.Module):
        raise ValueError("update_weights takes (name, tensor) pairs: pass model.named_parameters()")
    reset_prefix_cache()
    with streams.on(streams.compute), torch.no_grad():
        try:
            if callable(weights):
                return weights(model)
            copy_by_name(model, weights)
            return None
        finally:
            if after is not None:
                after()
