"""Rule-based rewards: number extraction, exact answers, answer format, the registry, the user's
own rewards through get_reward_functions, and scoring a group with weights."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.task.reward_loading import RewardFunctionError
from trainers.task.rewards import (
    REWARD_FUNCTIONS,
    answer_format,
    exact_answer,
    get_reward_functions,
    last_number,
)
from trainers.task.scoring import score_group


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She has 3 apples and 4 pears, so 7.", "7"),
        ("The total is 1,234 dollars.", "1234"),
        ("It costs $1,000,000.00", "1000000"),
        ("The change is -3", "-3"),
        ("x = (-2.5)", "-2.5"),
        ("Half is 2.50", "2.5"),
        ("The answer is 12.", "12"),
        ("Answer: 007", "7"),
        ("minus zero: -0.0", "0"),
        ("5-3 is two", "3"),
        ("COVID-19", "19"),
        ("1,2345", "2345"),
        ("items 1,2,3", "3"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="0123456789,.-ab \n", max_size=80), tail=st.integers(1, 12))
def test_last_number_read_from_the_end_equals_a_scan_of_the_whole_text(text, tail) -> None:
    import trainers.task.rewards as rewards

    matches = rewards._NUMBER_RE.findall(text)
    expected = rewards._normalise(matches[-1]) if matches else None
    original = rewards._TAIL_CHARS
    rewards._TAIL_CHARS = tail  # short stretches, so that most texts take several
    try:
        assert last_number(text) == expected
    finally:
        rewards._TAIL_CHARS = original


def test_exact_answer_plain_strings() -> None:
    completions = ["3 + 4 = 7\nAnswer: 7", "I think 8", "no idea", "Answer: 1,234.0"]
    rewards = exact_answer(None, completions, answer=["7", "7", "7", "1234"])
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_exact_answer_chat_completions() -> None:
    completions = [
        [{"role": "assistant", "content": "2 apples plus 3 apples.\nAnswer: 5"}],
        [{"role": "assistant", "content": "Answer: 5, no wait, 6"}],
        [],
    ]
    assert exact_answer(None, completions, answer=["5", "5", "5"]) == [1.0, 0.0, 0.0]


def test_exact_answer_compares_numerically() -> None:
    # "5.0" and "5" are the same number; a reference with no number never matches.
    assert exact_answer(None, ["Answer: 5.0", "Answer: 5"], answer=["5", "n/a"]) == [1.0, 0.0]


def test_exact_answer_length_mismatch() -> None:
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        exact_answer(None, ["1", "2"], answer=["1"])


def test_answer_format_levels() -> None:
    completions = [
        "Work: 2 + 2.\nanswer: 4\n\n",  # last non-empty line in the right form, any case
        "ANSWER : -1,000.",
        "The answer is 4",  # a number, but not as 'Answer: <number>'
        "Answer: 4\nHope that helps",  # the form is there but not on the last line
        "So the total is 6. Answer: 6",  # the form inside a sentence
        "Answer: four",
        "",
    ]
    assert answer_format(None, completions) == [1.0, 1.0, 0.5, 0.75, 0.75, 0.0, 0.0]


def test_answer_format_chat_completions() -> None:
    completions = [[{"role": "assistant", "content": "Answer: 3"}]]
    assert answer_format(None, completions) == [1.0]


def test_registry_names_match_function_names() -> None:
    # TRL logs each reward under fn.__name__, so it must be the registry key.
    assert set(REWARD_FUNCTIONS) == {"exact_answer", "answer_format", "environment"}
    for name, fn in REWARD_FUNCTIONS.items():
        assert fn.__name__ == name


def test_get_reward_functions_in_order() -> None:
    functions = get_reward_functions(["answer_format", "exact_answer"])
    assert [fn.__wrapped__ for fn in functions] == [answer_format, exact_answer]
    assert [fn.__name__ for fn in functions] == ["answer_format", "exact_answer"]


def test_get_reward_functions_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown reward function 'accuracy'") as info:
        get_reward_functions(["exact_answer", "accuracy"])
    assert "answer_format" in str(info.value) and "exact_answer" in str(info.value)
    assert "'path/to/file.py:function'" in str(info.value)


def test_get_reward_functions_empty() -> None:
    with pytest.raises(ValueError, match="no reward functions"):
        get_reward_functions([])


MY_REWARDS = """
import asyncio


def short(prompts, completions, **columns):
    return [1.0 if len(c) <= 3 else 0.0 for c in completions]


async def polite(prompts, completions, **columns):
    await asyncio.sleep(0)
    return [1.0 if "please" in c else None for c in completions]


def exact_answer(prompts, completions, **columns):  # clashes with the built-in's name
    return [0.0] * len(completions)


def broken(prompts, completions, **columns):
    raise ValueError("no judge")


def nan_for_empty(prompts, completions, **columns):
    flip = [float("nan"), float("inf")]
    return [float(len(c)) if c else flip[i % 2] for i, c in enumerate(completions)]
"""


@pytest.fixture
def my_rewards(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(MY_REWARDS))
    return path


def test_get_reward_functions_mixes_the_three_forms_in_order(my_rewards) -> None:
    functions = get_reward_functions(
        [f"{my_rewards}:polite", "exact_answer", "trainers.task.rewards:answer_format"]
    )
    assert [fn.__name__ for fn in functions] == ["polite", "exact_answer", "answer_format"]
    assert [fn.__wrapped__ for fn in functions[1:]] == [exact_answer, answer_format]
    assert functions[0](prompts=["p", "p"], completions=["please", "now"]) == [1.0, None]


def test_get_reward_functions_refuses_two_rewards_of_one_name(my_rewards) -> None:
    entry = f"{my_rewards}:exact_answer"
    with pytest.raises(ValueError, match="are both named 'exact_answer'") as info:
        get_reward_functions(["exact_answer", entry])
    assert entry in str(info.value) and "reward_weights" in str(info.value)


def test_get_reward_functions_names_the_entry_that_fails(my_rewards) -> None:
    with pytest.raises(ValueError, match="no attribute 'shrot'") as info:
        get_reward_functions(["exact_answer", f"{my_rewards}:shrot"])
    assert f"{my_rewards}:shrot" in str(info.value)


def _score(reward_funcs, weights=None, completions=("a", "abcd", "please")):
    completions = list(completions)
    return score_group(
        ["p"] * len(completions),
        completions,
        [[7] * len(c) for c in completions],
        {"answer": ["1"] * len(completions)},
        reward_funcs,
        weights,
    )


def test_score_group_weights_each_reward(my_rewards) -> None:
    short, polite = get_reward_functions([f"{my_rewards}:short", f"{my_rewards}:polite"])
    scored = _score([short, polite], [1.0, 0.2])
    # short: [1, 0, 0]; polite: [None, None, 1] (None adds nothing to the total).
    np.testing.assert_allclose(scored.rewards, [1.0, 0.0, 0.2])
    assert list(scored.per_function) == ["short", "polite"]
    assert math.isnan(scored.per_function["polite"][0]) and scored.per_function["polite"][2] == 1
    mean, std = scored.rewards.mean(), scored.rewards.std()
    np.testing.assert_allclose(scored.advantages, (scored.rewards - mean) / (std + 1e-4))
    # Without weights each counts 1.0.
    np.testing.assert_allclose(_score([short, polite]).rewards, [1.0, 0.0, 1.0])


def test_score_group_passes_completion_ids_and_the_columns() -> None:
    seen = {}

    def spy(prompts, completions, completion_ids, answer):
        seen.update(completion_ids=completion_ids, answer=answer)
        return [0.0] * len(completions)

    _score([spy], completions=["ab", "c"])
    assert seen == {"completion_ids": [[7, 7], [7]], "answer": ["1", "1"]}


def test_score_group_refuses_a_wrong_number_of_weights() -> None:
    with pytest.raises(ValueError, match="1 reward weights for 2 reward functions"):
        _score([answer_format, answer_format], [1.0])


def test_a_raising_reward_is_named_with_its_exception() -> None:
    def flaky(prompts, completions, **columns):
        raise KeyError("missing column")

    with pytest.raises(RewardFunctionError) as info:
        _score([answer_format, flaky])
    assert str(info.value) == "reward function 'flaky' raised KeyError: 'missing column'"
    assert info.value.name == "flaky" and isinstance(info.value.original, KeyError)
    assert info.value.__cause__ is info.value.original


def test_a_raising_reward_is_named_by_its_config_entry(my_rewards) -> None:
    (broken,) = get_reward_functions([f"{my_rewards}:broken"])
    with pytest.raises(RewardFunctionError) as info:
        broken(prompts=["p"], completions=["a"])
    assert str(info.value) == f"reward function '{my_rewards}:broken' raised ValueError: no judge"
    # Where it raised: the user's frames, not the wrapper's, and not the last line again.
    where = info.value.user_traceback()
    assert where.startswith("Traceback (most recent call last):")
    assert f'File "{my_rewards}", line' in where and "raise ValueError" in where
    assert "reward_loading.py" not in where and "ValueError: no judge" not in where


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([1.0, 2.0], "reward function 'bad' returned 2 values for 3 completions"),
        (1.0, "reward function 'bad' returned a float; it must return a list of 3"),
        ("1.0", "reward function 'bad' returned a str"),
        ([1.0, "0.5", 0.0], "reward function 'bad' returned '0.5' \\(a str\\) for completion 1"),
        (
            [1.0, [2.0], 0.0],
            "reward function 'bad' returned \\[2.0\\] \\(a list\\) for completion 1",
        ),
    ],
)
def test_a_reward_returning_the_wrong_shape_is_named(returned, message) -> None:
    def bad(prompts, completions, **columns):
        return returned

    with pytest.raises(RewardFunctionError, match=message) as info:
        _score([bad])
    assert info.value.name == "bad" and info.value.user_traceback() == ""


@pytest.mark.parametrize(
    ("bad", "what"),
    [(math.nan, "NaN"), (math.inf, "infinity"), (-np.inf, "infinity")],
)
def test_a_non_finite_reward_is_an_error_naming_the_function_and_the_count(bad, what) -> None:
    def half_bad(prompts, completions, **columns):
        return [bad if i % 2 else 1.0 for i in range(len(completions))]

    with pytest.raises(RewardFunctionError) as info:
        _score([half_bad], completions=["a"] * 8)
    assert str(info.value).startswith(
        f"reward function 'half_bad' returned {what} for 4 of 8 completions (indices 1, 3, 5, 7)"
    )
    assert "reward_nan_value" in str(info.value), "the message names the opt-in"


def test_none_still_means_not_scored_beside_a_nan_check() -> None:
    def partial(prompts, completions, **columns):
        return [None, 1.0, None]

    scored = _score([partial])
    np.testing.assert_allclose(scored.rewards, [0.0, 1.0, 0.0])


def test_the_opt_in_counts_nan_and_infinity_as_the_stated_value_with_a_warning(my_rewards) -> None:
    (fn,) = get_reward_functions([f"{my_rewards}:nan_for_empty"], nan_value=-1.0)
    with pytest.warns(RuntimeWarning) as caught:
        scored = _score([fn], completions=["ab", "", "", "abc"])
    np.testing.assert_allclose(scored.rewards, [2.0, -1.0, -1.0, 3.0])
    assert [str(w.message) for w in caught] == [
        f"reward function '{my_rewards}:nan_for_empty' returned NaN or infinity for 2 of 4 "
        "completions; counted as -1.0 (reward_nan_value), 2 so far"
    ]
    with pytest.warns(RuntimeWarning, match="for 1 of 2 completions.*, 3 so far"):
        assert fn(prompts=["p", "p"], completions=["", "a"]) == [-1.0, 1.0]


def test_numpy_values_and_tuples_are_numbers_enough() -> None:
    def np_reward(prompts, completions, **columns):
        return tuple(np.float32(len(c)) for c in completions)

    np.testing.assert_allclose(_score([np_reward]).rewards, [1.0, 4.0, 6.0])
