"""Score a completed group: rewards per sample, then group-normalised advantages. No TRL here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trainers.task.reward_loading import checked_reward, reward_name


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
    weights: Sequence[float] | None = None,
) -> ScoredGroup:
    """Call every reward function TRL-style (`fn(prompts=, completions=, completion_ids=,
    **columns)`), sum them with `weights` (None: 1.0 each), and normalise within the group:
    advantage = (r - mean) / (std + 1e-4), as TRL's GRPO does by default.

    A reward's None values ("no reward for this sample") count as 0 in the sum and NaN in
    `per_function`. A reward that raises, returns anything but one number or None per
    completion, or returns NaN or infinity (unless it was wrapped with a `nan_value`), stops
    with a `RewardFunctionError` naming it (`trainers.task.reward_loading.checked_reward`).
    """
    if weights is None:
        weights = [1.0] * len(reward_funcs)
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"{len(weights)} reward weights for {len(reward_funcs)} reward functions; "
            "give one weight per reward function"
        )
    n = len(completions)
    per_function = {}
    total = np.zeros(n, dtype=np.float64)
    for fn, weight in zip(reward_funcs, weights, strict=True):
        # The job's rewards come checked already (get_reward_functions); this covers any other.
        returned = checked_reward(fn)(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
        )
        values = np.array([np.nan if v is None else v for v in returned], dtype=np.float64)
        per_function[reward_name(fn)] = values
        total += weight * np.nan_to_num(values)
    advantages = (total - total.mean()) / (total.std() + 1e-4)
    return ScoredGroup(total, per_function, advantages)
