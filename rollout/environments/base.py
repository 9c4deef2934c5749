"""The environment interface: what a multi-turn task gives the rollout side.

An environment is a class; the rollout side makes one instance per episode (per sample):

    class MyEnv:
        stop = ("</tool>",)                  # strings that end a model turn (optional)

        def reset(self, row: dict) -> str | list[dict]:
            ...                              # the first prompt: text, or chat messages

        def step(self, model_text: str) -> StepResult:   # or `async def step`
            ...                              # the model's last turn in, what happens out

`reset` gets the dataset row. After every model turn, `step` gets that turn's text and returns
an observation to append (a tool's output, tokenized as is: include any tags or chat markup the
model should see), or `done=True` with the episode's reward. Both may be slow or may raise: they
run off the engine's thread, so other samples keep generating meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rollout.user_code import load_module, split_entry


@dataclass(frozen=True)
class StepResult:
    observation: str = ""
    """Text appended to the conversation before the model's next turn (ignored when done)."""
    done: bool = False
    reward: float = 0.0
    """The episode's reward, read when done."""


class Environment(Protocol):
    def reset(self, row: dict) -> str | list[dict]: ...

    def step(self, model_text: str) -> Any: ...


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits: an episode that reaches one ends with that status (and no reward)."""

    max_turns: int = 8
    """Model turns."""
    max_tokens: int = 1024
    """Tokens after the first prompt: the model's and the environment's."""
    tool_timeout_s: float = 30.0
    """Seconds one reset() or step() may take; past it the episode ends with "tool_timeout"."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EpisodeLimits.{name} must be an int >= 1; got {value!r}")
        if not self.tool_timeout_s > 0:
            raise ValueError(f"EpisodeLimits.tool_timeout_s must be > 0; got {self.tool_timeout_s}")


def load_environment(entry: str) -> type:
    """The environment class an entry names ("package.module:Class" or "file.py:Class"), checked
    for reset and step; ValueError naming what to change."""
    target, attribute = split_entry(entry, "environment")
    module = load_module(entry, target, "environment")
    env_class = getattr(module, attribute, None)
    if env_class is None:
        raise ValueError(f"environment {entry!r}: {target} has no attribute {attribute!r}")
    missing = [m for m in ("reset", "step") if not callable(getattr(env_class, m, None))]
    if missing or not callable(env_class):
        raise ValueError(
            f"environment {entry!r}: {attribute} must be a class with reset(row) and "
            f"step(model_text) methods; missing {missing or ['a constructor']}"
        )
    return env_class
