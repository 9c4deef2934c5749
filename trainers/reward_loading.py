"""Turn a reward entry from the job config into a plain callable.

An entry is a registered name ("exact_answer"), "package.module:function" (imported), or
"path/to/file.py:function" (loaded from that file; a relative path resolves against the current
directory). The function has TRL's reward signature, ``fn(prompts, completions, **columns)``,
and may be ``async def``: such a function comes back wrapped in a plain one that runs it to
completion, so TRL's GRPOTrainer and ``trainers.scoring.score_group`` call every reward alike.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

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
    if not target or not attribute:
        raise ValueError(f"reward {entry!r}: give both sides of the ':', as in {_FORMS}")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _module_from_file(entry, target)
    else:
        module = _module_from_import(entry, target)
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


def _module_from_import(entry: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ImportError as err:
        raise ValueError(
            f"reward {entry!r}: cannot import module {target!r} ({err}); check the spelling, "
            "that its package is installed or on PYTHONPATH, or give a file as "
            "'path/to/file.py:function'"
        ) from err


def _module_from_file(entry: str, target: str) -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    path = path.resolve()
    if not path.is_file():
        raise ValueError(
            f"reward {entry!r}: file {path} not found (a relative path resolves against the "
            f"current directory, {Path.cwd()}); fix the path or run from the folder it is "
            "relative to"
        )
    # One module per file, under a name no import can clash with: two rewards from one file
    # share its module (and any state it keeps), and classes defined there can find their module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"_reward_file_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"reward {entry!r}: {path} cannot be loaded as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # A file that failed to run is not cached, so the next attempt (once fixed) runs it again.
        del sys.modules[name]
        raise
    return module
