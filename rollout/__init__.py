"""rollout: fast RL rollout generation over transformers models.

from rollout import LLMEngine, EngineConfig, SamplingParams, Completion

The names load on first use, so that importing a torch-free part of the package (the engine's
scheduling, the configs) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.engine.config import EngineConfig
    from rollout.engine.llm_engine import LLMEngine
    from rollout.engine.sampling_params import SamplingParams
    from rollout.engine.scheduling.sequence import Completion

_PUBLIC = {
    "Completion": "rollout.engine.scheduling.sequence",
    "EngineConfig": "rollout.engine.config",
    "LLMEngine": "rollout.engine.llm_engine",
    "SamplingParams": "rollout.engine.sampling_params",
}

__all__ = ["Completion", "EngineConfig", "LLMEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'rollout' has no attribute {name!r}")
