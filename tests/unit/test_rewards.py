"""Rule-based rewards: number extraction, exact answers, answer format, and the registry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.rewards import (
    REWARD_FUNCTIONS,
    answer_format,
    exact_answer,
    get_reward_functions,
    last_number,
)


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
    import trainers.rewards as rewards

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
        "Answer: four",
        "",
    ]
    assert answer_format(None, completions) == [1.0, 1.0, 0.5, 0.5, 0.0, 0.0]


def test_answer_format_chat_completions() -> None:
    completions = [[{"role": "assistant", "content": "Answer: 3"}]]
    assert answer_format(None, completions) == [1.0]


def test_registry_names_match_function_names() -> None:
    # TRL logs each reward under fn.__name__, so it must be the registry key.
    assert set(REWARD_FUNCTIONS) == {"exact_answer", "answer_format"}
    for name, fn in REWARD_FUNCTIONS.items():
        assert fn.__name__ == name


def test_get_reward_functions_in_order() -> None:
    assert get_reward_functions(["answer_format", "exact_answer"]) == [answer_format, exact_answer]


def test_get_reward_functions_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown reward function 'accuracy'") as info:
        get_reward_functions(["exact_answer", "accuracy"])
    assert "answer_format" in str(info.value) and "exact_answer" in str(info.value)


def test_get_reward_functions_empty() -> None:
    with pytest.raises(ValueError, match="no reward functions"):
        get_reward_functions([])
