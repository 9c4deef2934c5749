"""Score a completed group: rewards per sample, then group-normalised advantages. No TRL here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class ScoredGroup:
    rewards: np.ndarray  # [G] total reward per sample
    per_function: dict[str, np.ndarray]  # reward function name -> [G]
    advantages: np.ndarray  # [G]


def score_group(
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    columns: dict[str, list],
    reward_funcs: list[Callable],
    weights: list[float] | None = None,
) -> ScoredGroup:
    """Call every reward function TRL-style (`fn(prompts=, completions=, completion_ids=,
    **columns)`), sum them with `weights`, and normalise within the group:
    advantage = (r - mean) / (std + 1e-4), as TRL's GRPO does by default."""
    weights = weights or [1.0] * len(reward_funcs)
    per_function = {}
    total = np.zeros(len(completions), dtype=np.float64)
    for fn, weight in zip(reward_funcs, weights, strict=True):
        values = fn(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
        )
        values = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        if len(values) != len(completions):
            raise ValueError(
                f"reward function {fn.__name__} returned {len(values)} values for {len(completions)} completions"
            )
        per_function[getattr(fn, "__name__", str(fn))] = values
        total += weight * np.nan_to_num(values)
    advantages = (total - total.mean()) / (total.std() + 1e-4)
    return ScoredGroup(total, per_function, advantages)
