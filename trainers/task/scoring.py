"""Score a completed group: rewards per sample, then group-normalised advantages. No TRL here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainers.task.reward_loading import reward_name


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
    `per_function`. A reward that raises, or returns anything but one number or None per
    completion, stops with a RuntimeError naming it.
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
        name = reward_name(fn)
        try:
            returned = fn(
                prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
            )
        except Exception as err:
            # The user's traceback stays chained below; this line says which reward and where.
            raise RuntimeError(
                f"reward function {name} failed on a group of {n} completions: {err!r}"
            ) from err
        values = _reward_values(name, returned, n)
        per_function[name] = values
        total += weight * np.nan_to_num(values)
    advantages = (total - total.mean()) / (total.std() + 1e-4)
    return ScoredGroup(total, per_function, advantages)


def _reward_values(name: str, returned: Any, n: int) -> np.ndarray:
    """A reward's return value as [n] floats (None -> NaN), or a RuntimeError naming it."""
    # A string or a mapping has a length too, but is never one value per completion. TRL calls
    # len() on the result, so an iterator without one would fail there: refuse it here as well.
    if isinstance(returned, str | bytes | Mapping) or not hasattr(returned, "__len__"):
        raise RuntimeError(
            f"reward function {name} returned a {type(returned).__name__}; it must return a "
            f"list of {n} floats (or None), one per completion"
        )
    if len(returned) != n:
        raise RuntimeError(
            f"reward function {name} returned {len(returned)} values for {n} completions; "
            "it must return one float (or None) per completion"
        )
    values = np.empty(n, dtype=np.float64)
    for i, value in enumerate(returned):
        # float() would also read "0.5" from a string: a reward returning text is a bug to report.
        try:
            if isinstance(value, str | bytes):
                raise TypeError
            values[i] = np.nan if value is None else float(value)
        except (TypeError, ValueError):
            raise RuntimeError(
                f"reward function {name} returned {value!r} (a {type(value).__name__}) for "
                f"completion {i}; each value must be a number or None"
            ) from None
    return values
