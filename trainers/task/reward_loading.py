"""Turn a reward entry from the job config into a plain callable.

An entry is a registered name ("exact_answer"), "package.module:function" (imported), or
"path/to/file.py:function" (loaded from that file; a relative path resolves against the current
directory). The function has TRL's reward signature, ``fn(prompts, completions, **columns)``,
and may be ``async def``: such a function comes back wrapped in a plain one that runs it to
completion, so TRL's GRPOTrainer and ``trainers.task.scoring.score_group`` call every reward alike.

``checked_reward`` wraps a loaded function with the checks both trainer modes need, in the one
place every call goes through: a raise, a result that is not one value per completion, or a NaN
or infinite value becomes a ``RewardFunctionError`` naming the function (or, with a
``nan_value``, NaN and infinity count as that number with a warning). None stays None: "this
function does not score this completion", which TRL's GRPOTrainer and our scorer leave out.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import threading
import traceback
import warnings
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


class RewardFunctionError(RuntimeError):
    """A reward function failed: it raised, returned something other than one number (or None)
    per completion, or returned NaN or infinity. ``name`` is the reward as the config names it;
    ``original`` is the exception the function raised (None when it returned a bad value)."""

    def __init__(self, name: str, problem: str, original: BaseException | None = None) -> None:
        super().__init__(f"reward function {name!r} {problem}")
        self.name = name
        self.original = original

    def user_traceback(self) -> str:
        """Where the function raised: ``original``'s traceback (with any exceptions it chains)
        minus the wrappers' frames of this module and minus its last line, the exception itself,
        which ``str(self)`` already names. Empty when the function returned a bad value."""
        if self.original is None:
            return ""
        report = traceback.TracebackException.from_exception(self.original)
        report.stack = traceback.StackSummary.from_list(
            [frame for frame in report.stack if frame.filename != __file__]
        )
        lines = list(report.format())
        return "".join(lines[: len(lines) - len(list(report.format_exception_only()))])


def checked_reward(
    fn: Callable[..., Any], name: str | None = None, nan_value: float | None = None
) -> RewardFunction:
    """``fn`` under its own ``__name__`` (TRL logs rewards by it), with every call checked.

    The wrapper returns a list of floats and Nones, one per completion. It raises
    ``RewardFunctionError`` naming ``name`` (default: the function's name) when ``fn`` raises,
    returns anything but one number or None per completion, or returns NaN or an infinity while
    ``nan_value`` is None. With a ``nan_value`` those values count as it, and each call that had
    any warns with their count.
    """
    if getattr(fn, "_checked_reward", False):
        return fn
    label = name if name is not None else reward_name(fn)
    if nan_value is not None:
        nan_value = float(nan_value)
    replaced = _Counter()
    code = getattr(inspect.unwrap(fn), "__code__", None)  # a callable object has none

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> list[float | None]:
        completions = kwargs["completions"] if "completions" in kwargs else args[1]
        n = len(completions)
        try:
            returned = fn(*args, **kwargs)
        except Exception as err:
            said = f": {err}" if str(err) else ""
            raise RewardFunctionError(
                label, f"raised {type(err).__name__}{said}", original=err
            ) from err
        values = reward_values(label, returned, n)
        bad = [i for i, v in enumerate(values) if v is not None and not math.isfinite(v)]
        if not bad:
            return values
        what = _non_finite_kind([values[i] for i in bad])
        if nan_value is None:
            raise RewardFunctionError(
                label,
                f"returned {what} for {len(bad)} of {n} completions (indices "
                f"{_indices(bad)}); return a finite number, or None for a completion it does "
                "not score, or set reward_nan_value to count such values as a number",
            )
        total = replaced.add(len(bad))
        message = (
            f"reward function {label!r} returned {what} for {len(bad)} of {n} completions; "
            f"counted as {nan_value} (reward_nan_value), {total} so far"
        )
        if code is None:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        else:  # shown at the function's own `def`, where the fix goes, rather than our call
            warnings.warn_explicit(message, RuntimeWarning, code.co_filename, code.co_firstlineno)
        for i in bad:
            values[i] = nan_value
        return values

    # functools.wraps finds no __name__ on a callable object; TRL logs rewards by this name.
    wrapper.__name__ = reward_name(fn)
    wrapper._checked_reward = True  # type: ignore[attr-defined]
    return wrapper


def reward_values(name: str, returned: Any, n: int) -> list[float | None]:
    """A reward's return value as n floats or Nones, or a RewardFunctionError naming it."""
    # A string or a mapping has a length too, but is never one value per completion. TRL calls
    # len() on the result, so an iterator without one would fail there: refuse it here as well.
    if isinstance(returned, str | bytes | Mapping) or not hasattr(returned, "__len__"):
        raise RewardFunctionError(
            name,
            f"returned a {type(returned).__name__}; it must return a list of {n} floats "
            "(or None), one per completion",
        )
    if len(returned) != n:
        raise RewardFunctionError(
            name,
            f"returned {len(returned)} values for {n} completions; it must return one float "
            "(or None) per completion",
        )
    values: list[float | None] = []
    for i, value in enumerate(returned):
        # float() would also read "0.5" from a string: a reward returning text is a bug to report.
        try:
            if isinstance(value, str | bytes):
                raise TypeError
            values.append(None if value is None else float(value))
        except (TypeError, ValueError):
            raise RewardFunctionError(
                name,
                f"returned {value!r} (a {type(value).__name__}) for completion {i}; each value "
                "must be a number or None",
            ) from None
    return values


class _Counter:
    """A running total shared by the threads that call one reward."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0

    def add(self, count: int) -> int:
        with self._lock:
            self._total += count
            return self._total


def _non_finite_kind(values: list[float]) -> str:
    nan = any(math.isnan(v) for v in values)
    inf = any(math.isinf(v) for v in values)
    return "NaN or infinity" if nan and inf else "NaN" if nan else "infinity"


def _indices(indices: list[int], shown: int = 5) -> str:
    text = ", ".join(str(i) for i in indices[:shown])
    return text + (", ..." if len(indices) > shown else "")
