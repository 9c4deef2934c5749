"""Switch a transformers model to one of our implementations for the engine's forwards only.

transformers reads the attention and the MoE experts implementation from the config
(`_attn_implementation`, `_experts_implementation`) at every call, so setting the attribute for
the length of a step is enough, and restoring it leaves `model(ids)` as it was outside.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def implementation_selected(configs: list, attribute: str, name: str) -> Iterator[None]:
    before = [getattr(c, attribute) for c in configs]
    for c in configs:
        setattr(c, attribute, name)
    try:
        yield
    finally:
        for c, value in zip(configs, before, strict=True):
            setattr(c, attribute, value)
