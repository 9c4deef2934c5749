"""Rule-based reward functions for GRPO on math word problems, and a registry to pick them by name.

Every reward follows TRL's reward-function signature, ``fn(prompts, completions, **kwargs)``,
where ``kwargs`` carries the dataset's other columns (one value per completion). TRL logs each
reward under the function's ``__name__``, so the names below are also the registry keys.
``get_reward_functions`` also takes the user's own rewards (see ``trainers.task.reward_loading``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trainers.task.reward_loading import (
    RewardFunction,
    checked_reward,
    load_reward_function,
    reward_name,
)

# A number as models write it: optional minus, either comma-grouped thousands (1,234,567) or plain
# digits, then an optional fraction. A minus counts only when no letter or digit precedes it, so
# "5-3" reads as "5" and "3" and "COVID-19" as "19". The lookahead rejects a group like "1,2345",
# which falls back to "1" and "2345". "12." stops before the dot: a fraction needs a digit.
_NUMBER = r"(?<!\d)(?:(?<!\w)-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_ANSWER_LINE_RE = re.compile(rf"answer\s*:\s*({_NUMBER})\s*\.?", re.IGNORECASE)


def _normalise(number: str) -> str:
    """Canonical text of a matched number, so string equality is numeric equality."""
    sign = "-" if number.startswith("-") else ""
    whole, _, fraction = number.lstrip("-").replace(",", "").partition(".")
    whole = whole.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    text = f"{whole}.{fraction}" if fraction else whole
    return "0" if text == "0" else sign + text  # "-0" and "-0.0" are zero


_TAIL_CHARS = 256  # the first stretch of a completion's end searched for its last number


def last_number(text: str) -> str | None:
    """The last number in ``text``, normalised ("1,234" -> "1234", "2.50" -> "2.5"), or None.

    Read from the end, in stretches that double: the answer sits near the end, and every sample
    of every group (16K tokens, ~60K characters, in the GPU recipe) is scored on the trainer's
    process, where a scan of the whole text is slow (docs/performance.md, 'Reward scoring').
    Each stretch starts at whitespace, which no number spans, so it holds the same matches a scan
    from the start finds there.
    """
    end, size = len(text), _TAIL_CHARS
    while end > 0:
        start = _whitespace_at_or_before(text, end - size)
        last = None
        for last in _NUMBER_RE.finditer(text, start, end):  # noqa: B007 - the last one is kept
            pass
        if last is not None:
            return _normalise(last.group())
        end, size = start, size * 2
    return None


def _whitespace_at_or_before(text: str, position: int) -> int:
    """The last space or line break at or before ``position``, or 0 (the start)."""
    if position <= 0:
        return 0
    return max(0, max(text.rfind(c, 0, position + 1) for c in " \n\t\r"))


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """The text of one completion: a plain string, or the content of a chat list's last message."""
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    content = completion[-1].get("content") or ""
    if isinstance(content, str):
        return content
    # Multimodal chat content is a list of parts; only the text parts can hold an answer.
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def exact_answer(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answer: Sequence[str],
    **kwargs: Any,
) -> list[float]:
    """1.0 where the completion's last number equals the reference ``answer`` numerically, else 0.0.

    ``answer`` is the dataset's answer column, one entry per completion (TRL repeats each row's
    answer for every completion sampled from it).
    """
    if len(answer) != len(completions):
        raise ValueError(
            f"exact_answer got {len(completions)} completions but {len(answer)} answers; "
            "the dataset's 'answer' column must have one entry per prompt"
        )
    rewards = []
    for completion, reference in zip(completions, answer, strict=True):
        expected = last_number(str(reference))
        got = last_number(completion_text(completion))
        rewards.append(1.0 if expected is not None and got == expected else 0.0)
    return rewards


def answer_format(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 if the last non-empty line is ``Answer: <number>``; 0.75 if ``Answer: <number>``
    appears elsewhere (inside a sentence, or followed by more text); 0.5 if only a number appears;
    0.0 if the completion has no number at all.

    The middle step is there for learning: a small model writes the answer line inside its
    prose several times more often than alone at the end, so the graded reward gives GRPO a
    difference to learn from long before the exact format shows up."""
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines and _ANSWER_LINE_RE.fullmatch(lines[-1]):
            rewards.append(1.0)
        elif _ANSWER_LINE_RE.search(text):
            rewards.append(0.75)
        elif last_number(text) is not None:
            rewards.append(0.5)
        else:
            rewards.append(0.0)
    return rewards


def environment(
    prompts: Sequence[Any], completions: Sequence[Any], env_reward: Sequence[float | None], **kwargs
) -> list[float]:
    """The environment's own reward for each episode (multi-turn rollouts: environment.name)."""
    return [0.0 if r is None else float(r) for r in env_reward]


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "exact_answer": exact_answer,
    "answer_format": answer_format,
    "environment": environment,
}
for _name, _fn in REWARD_FUNCTIONS.items():
    assert _fn.__name__ == _name, f"reward {_fn.__name__} is registered as {_name}"


def get_reward_functions(
    entries: Sequence[str], nan_value: float | None = None
) -> list[RewardFunction]:
    """The reward functions ``entries`` name, in order (for GRPOTrainer's reward_funcs).

    An entry is a registered name (REWARD_FUNCTIONS), "package.module:function" or
    "path/to/file.py:function"; ``async def`` functions come back as plain ones. Raises
    ValueError, naming the entry, for one that cannot be loaded.

    Each comes back checked (``checked_reward``), so both trainer modes stop on a failing reward
    with a ``RewardFunctionError`` naming its entry; ``nan_value`` (the job's reward_nan_value)
    is what a NaN or infinite value counts as, None making it an error.
    """
    if not entries:
        raise ValueError(
            f"no reward functions given; choose from {sorted(REWARD_FUNCTIONS)} or give "
            "'package.module:function' or 'path/to/file.py:function'"
        )
    functions = [load_reward_function(entry, REWARD_FUNCTIONS) for entry in entries]
    # TRL logs each reward under its name and our scorer keys its metrics by it: two rewards of
    # one name would show as one.
    seen: dict[str, str] = {}
    for entry, fn in zip(entries, functions, strict=True):
        name = reward_name(fn)
        if name in seen:
            raise ValueError(
                f"rewards {seen[name]!r} and {entry!r} are both named {name!r} (rewards are "
                "logged by name); list a reward once and weight it with reward_weights, or "
                "rename one of the functions"
            )
        seen[name] = entry
    return [
        checked_reward(fn, entry, nan_value) for entry, fn in zip(entries, functions, strict=True)
    ]
