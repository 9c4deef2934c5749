"""An example of a reward of your own: prefer concise completions.

Use it next to a correctness reward, with a small weight, so that among right answers the short
ones win (on its own it would teach the model to say little). In a job config:

    rewards: [exact_answer, examples/rewards/length_penalty.py:concise]
    reward_weights: [1.0, 0.2]

or as overrides on the command line:

    'rewards=[exact_answer,examples/rewards/length_penalty.py:concise]' 'reward_weights=[1.0,0.2]'

A relative path resolves against the directory the job starts in (here, the repository root).
The function takes TRL's reward arguments: ``prompts``, ``completions``, ``completion_ids`` and
the dataset's other columns, one value per completion, and returns one float per completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TARGET_TOKENS = 32
"""Completions up to this many tokens get the full reward: room for a short working and the
'Answer: <number>' line the arithmetic prompts ask for."""


def concise(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    **columns: Any,
) -> list[float]:
    """1.0 up to TARGET_TOKENS tokens, then falling linearly to 0.0 at twice that length.

    Counted in tokens (``completion_ids``), not characters: tokens are what the model spends.
    """
    return [
        max(0.0, 1.0 - max(0, len(ids) - TARGET_TOKENS) / TARGET_TOKENS) for ids in completion_ids
    ]
