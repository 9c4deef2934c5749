"""Per-step state that our attention function reads while transformers runs the model.

transformers calls the registered attention function once per layer with q/k/v only; everything
paged (which slots to write, which blocks to read) comes from the context the runner sets around
the forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rollout.kernels.attention_metadata import AttentionMetadata
from rollout.kernels.registry import AttentionBackend


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    kv_caches: list  # per layer: a LayerKV (k, v, and an FP8 cache's scales)
    backend: AttentionBackend
    windows: tuple[int | None, ...]  # per layer: sliding window, None for full attention
    layers_attended: list[int] | None = None  # construction-time check: the layers that attended


_current: ForwardContext | None = None


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[None]:
    global _current
    previous, _current = _current, ctx
    try:
        yield
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError(
            "paged attention was called outside an engine step (the engine selects it only for "
            "its own forwards)"
        )
    return _current
