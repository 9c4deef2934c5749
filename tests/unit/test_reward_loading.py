"""Reward entries: registered names, module:function, file.py:function, async rewards, errors."""

from __future__ import annotations

import inspect
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from trainers.task.reward_loading import load_reward_function, reward_name, run_to_completion
from trainers.task.rewards import REWARD_FUNCTIONS, answer_format, exact_answer

REPO = Path(__file__).resolve().parents[2]

# A reward that shows what it was called with: the completion's length plus the row's `bonus`
# column and the completion's token count, so a test sees every argument arrive.
USER_REWARDS = """
import asyncio

THRESHOLD = 3


def by_length(prompts, completions, completion_ids, bonus, **columns):
    return [len(c) + b + len(ids) / 10 for c, b, ids in zip(completions, bonus, completion_ids)]


def skip_empty(prompts, completions, **columns):
    return [None if not c else 1.0 for c in completions]


async def judged(prompts, completions, **columns):
    await asyncio.sleep(0)  # a real judge would await a request here
    return [1.0 if "yes" in c else 0.0 for c in completions]


class Judge:
    async def __call__(self, prompts, completions, **columns):
        await asyncio.sleep(0)
        return [float(len(completions))] * len(completions)


judge = Judge()
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """An importable package `user_rewards_pkg` with the rewards above, gone after the test."""
    _write(tmp_path / "pkgroot" / "user_rewards_pkg" / "__init__.py", "")
    _write(tmp_path / "pkgroot" / "user_rewards_pkg" / "scores.py", USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgroot"))
    yield "user_rewards_pkg.scores"
    for name in ("user_rewards_pkg.scores", "user_rewards_pkg"):
        sys.modules.pop(name, None)


def _call(fn, completions, **columns):
    return fn(
        prompts=["p"] * len(completions),
        completions=completions,
        completion_ids=[[0] * len(c) for c in completions],
        **columns,
    )


def test_a_registered_name_is_the_registered_function() -> None:
    assert load_reward_function("answer_format", REWARD_FUNCTIONS) is answer_format


def test_module_form_imports_the_function(user_package) -> None:
    assert (
        load_reward_function("trainers.task.rewards:exact_answer", REWARD_FUNCTIONS) is exact_answer
    )
    fn = load_reward_function(f"{user_package}:by_length", REWARD_FUNCTIONS)
    assert fn.__name__ == "by_length" and fn.__module__ == user_package
    # len("ab") + 1 bonus + 2 token ids / 10, then len("abcd") + 0 + 4 / 10.
    assert _call(fn, ["ab", "abcd"], bonus=[1, 0]) == [3.2, 4.4]


def test_file_form_resolves_a_relative_path_against_the_current_directory(
    tmp_path, monkeypatch
) -> None:
    _write(tmp_path / "mine" / "rewards.py", USER_REWARDS)
    monkeypatch.chdir(tmp_path)
    fn = load_reward_function("mine/rewards.py:by_length", REWARD_FUNCTIONS)
    assert fn.__name__ == "by_length"
    assert _call(fn, ["abc"], bonus=[2]) == [5.3]
    skip = load_reward_function("mine/rewards.py:skip_empty", REWARD_FUNCTIONS)
    assert _call(skip, ["", "x"]) == [None, 1.0]
    # Two rewards of one file share one module, run once (module state is shared, not copied).
    assert skip.__globals__ is fn.__globals__


def test_file_form_takes_an_absolute_path(tmp_path) -> None:
    path = _write(tmp_path / "abs_rewards.py", USER_REWARDS)
    fn = load_reward_function(f"{path}:skip_empty", REWARD_FUNCTIONS)
    assert _call(fn, ["a", ""]) == [1.0, None]


def test_a_sync_function_comes_back_unwrapped(tmp_path) -> None:
    path = _write(tmp_path / "sync_rewards.py", USER_REWARDS)
    fn = load_reward_function(f"{path}:skip_empty", REWARD_FUNCTIONS)
    assert not hasattr(fn, "__wrapped__")
    assert inspect.getsourcefile(fn) == str(path)


def _looks_async_to_trl(fn) -> bool:
    # trl.trainer.utils.is_async_callable: an async reward would be awaited, not called.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(fn.__call__)


def test_an_async_function_becomes_a_plain_one_of_the_same_name(user_package) -> None:
    fn = load_reward_function(f"{user_package}:judged", REWARD_FUNCTIONS)
    assert fn.__name__ == "judged" and reward_name(fn) == "judged"
    assert not _looks_async_to_trl(fn)
    assert _call(fn, ["yes", "no", "oh yes"]) == [1.0, 0.0, 1.0]
    assert _call(fn, ["no"]) == [0.0]  # a second call gets its own event loop


def test_an_async_callable_object_is_named_after_its_class(tmp_path) -> None:
    path = _write(tmp_path / "objects.py", USER_REWARDS)
    fn = load_reward_function(f"{path}:judge", REWARD_FUNCTIONS)
    assert fn.__name__ == "Judge" and not _looks_async_to_trl(fn)
    assert _call(fn, ["a", "b", "c"]) == [3.0, 3.0, 3.0]


def test_an_async_reward_runs_on_a_thread_without_an_event_loop(user_package) -> None:
    # The streaming scorer calls rewards from its rollout-worker thread.
    fn = load_reward_function(f"{user_package}:judged", REWARD_FUNCTIONS)
    results = []
    thread = threading.Thread(target=lambda: results.append(_call(fn, ["yes", "nope"])))
    thread.start()
    thread.join(timeout=30)
    assert results == [[1.0, 0.0]]


def test_run_to_completion_returns_the_coroutine_result() -> None:
    async def shout(prompts, completions, **columns):
        return [float(c.isupper()) for c in completions]

    wrapped = run_to_completion(shout)
    assert wrapped.__name__ == "shout" and wrapped.__wrapped__ is shout
    assert wrapped(prompts=[None, None], completions=["HI", "hi"]) == [1.0, 0.0]


def test_the_concise_example_loads_from_its_documented_entry(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    fn = load_reward_function("examples/rewards/length_penalty.py:concise", REWARD_FUNCTIONS)
    lengths = [10, 32, 48, 64, 100]
    values = fn(prompts=["p"] * 5, completions=["c"] * 5, completion_ids=[[1] * n for n in lengths])
    assert values == [1.0, 1.0, 0.5, 0.0, 0.0]


def _error(entry: str) -> str:
    with pytest.raises(ValueError) as info:
        load_reward_function(entry, REWARD_FUNCTIONS)
    message = str(info.value)
    assert "\n" not in message and entry in message
    return message


def test_an_unknown_name_lists_the_names_and_the_other_forms() -> None:
    message = _error("accuracy")
    assert "['answer_format', 'environment', 'exact_answer']" in message
    assert "'package.module:function'" in message and "'path/to/file.py:function'" in message


def test_a_module_that_cannot_be_imported() -> None:
    message = _error("no_such_package_here.rewards:score")
    assert "cannot import module 'no_such_package_here.rewards'" in message
    assert "PYTHONPATH" in message


def test_a_missing_file_names_its_resolved_path_and_the_current_directory(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    message = _error("rewards/missing.py:score")
    assert f"file {tmp_path.resolve() / 'rewards' / 'missing.py'} not found" in message
    assert f"current directory, {tmp_path}" in message


def test_a_missing_attribute_lists_the_functions_the_module_defines(tmp_path) -> None:
    path = _write(tmp_path / "few.py", USER_REWARDS)
    message = _error(f"{path}:by_lenght")
    assert "no attribute 'by_lenght'" in message
    # Its own functions, not the classes or the modules it imports.
    assert "['by_length', 'judged', 'skip_empty']" in message


def test_an_attribute_that_is_not_callable(tmp_path) -> None:
    path = _write(tmp_path / "consts.py", USER_REWARDS)
    message = _error(f"{path}:THRESHOLD")
    assert "THRESHOLD" in message and "not callable (its type is int)" in message


@pytest.mark.parametrize("entry", ["trainers.task.rewards:", ":exact_answer"])
def test_an_entry_with_an_empty_side(entry: str) -> None:
    assert "give both sides of the ':'" in _error(entry)


def test_a_file_that_fails_to_run_is_run_again_once_fixed(tmp_path) -> None:
    path = _write(tmp_path / "fixed_later.py", "raise RuntimeError('not yet')\n")
    with pytest.raises(RuntimeError, match="not yet"):
        load_reward_function(f"{path}:skip_empty", REWARD_FUNCTIONS)
    _write(path, USER_REWARDS)
    fn = load_reward_function(f"{path}:skip_empty", REWARD_FUNCTIONS)
    assert _call(fn, [""]) == [None]
