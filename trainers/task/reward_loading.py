"""Turn a reward entry from the job config into a plain callable.

An entry is a registered name ("exact_answer"), "package.module:function" (imported), or
"path/to/file.py:function" (loaded from that file; a relative path resolves against the current
directory). The function has TRL's reward signature, ``fn(prompts, completions, **columns)``,
and may be ``async def``: such a function comes back wrapped in a plain one that runs it to
completion, so TRL's GRPOTrainer and ``trainers.task.scoring.score_group`` call every reward alike.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from rollout.user_code import load_module, split_entry

RewardFunction = Callable[..., list[float | None]]

_FORMS = "'package.module:function' or 'path/to/file.py:function'"


def reward_name(fn: Callable[..., Any]) -> str:
    """The name a reward is logged under: ``__name__``, or the class name of a callable object
    (as TRL names it, so our metrics and TRL's agree)."""
    return getattr(fn, "__name__", type(fn).__name__)


def load_reward_function(entry: str, registry: Mapping[str, RewardFunction]) -> RewardFunction:
    """The reward function ``entry`` names: a key of ``registry``, or one of the two import forms.

    Raises ValueError, one line naming the entry and what to change, when it cannot be found.
    """
    target, colon, attribute = entry.rpartition(":")
    if not colon:
        if entry in registry:
            return registry[entry]
        raise ValueError(
            f"unknown reward function {entry!r}; registered names are {sorted(registry)}, "
            f"or give {_FORMS}"
        )
    target, attribute = split_entry(entry, "reward")
    module = load_module(entry, target, "reward")
    if not hasattr(module, attribute):
        # The functions the module defines itself (not those it imports) are the likely targets.
        defined = sorted(
            name
            for name, value in vars(module).items()
            if inspect.isfunction(value)
            and value.__module__ == module.__name__
            and not name.startswith("_")
        )
        raise ValueError(
            f"reward {entry!r}: {target} has no attribute {attribute!r}; "
            f"the functions it defines are {defined[:20]}"
        )
    fn = getattr(module, attribute)
    if not callable(fn):
        raise ValueError(
            f"reward {entry!r}: {attribute} in {target} is not callable (its type is "
            f"{type(fn).__name__}); point at a function fn(prompts, completions, **columns) "
            "-> list[float]"
        )
    return run_to_completion(fn) if _is_async(fn) else fn


def run_to_completion(fn: Callable[..., Any]) -> RewardFunction:
    """A plain function that calls the async ``fn`` and returns its result, under ``fn``'s name.

    TRL's GRPOTrainer would await an async reward on its own loop, but our streaming scorer calls
    rewards from a plain thread, so one wrapper serves both. Each call gets a fresh event loop:
    rewards run on threads without one, and a loop kept between calls would tie the wrapper to
    the thread that made it.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> list[float | None]:
        return asyncio.run(fn(*args, **kwargs))

    # functools.wraps finds no __name__ on a callable object; TRL logs rewards by this name.
    wrapper.__name__ = reward_name(fn)
    return wrapper


def _is_async(fn: Callable[..., Any]) -> bool:
    # A callable object carries its `async` on __call__, which iscoroutinefunction(fn) misses.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself is what is inspected
    )
