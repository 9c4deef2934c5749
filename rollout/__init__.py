"""rollout: fast RL rollout generation over transformers models.

from rollout import LLMEngine, EngineConfig, SamplingParams, Completion
"""

from rollout.engine.config import EngineConfig
from rollout.engine.llm_engine import LLMEngine
from rollout.engine.sampling_params import SamplingParams
from rollout.engine.sequence import Completion

__all__ = ["Completion", "EngineConfig", "LLMEngine", "SamplingParams"]
