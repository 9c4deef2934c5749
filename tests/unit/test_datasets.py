"""Prompt datasets: the arithmetic generator, gsm_symbolic, and loading local files and folders."""

from __future__ import annotations

import importlib.util
import json
import re

import datasets  # noqa: E402
import pytest

from trainers.task.datasets import (  # noqa: E402
    _TEMPLATES,
    ANSWER_INSTRUCTION,
    arithmetic_dataset,
    gsm_symbolic_dataset,
    load_prompt_dataset,
)

HAS_REASONING_GYM = importlib.util.find_spec("reasoning_gym") is not None


def _template_regex(template: str) -> re.Pattern[str]:
    """A regex matching questions made from ``template``; {a} and {b} capture their counts."""
    pattern, seen = "", set()
    for part in re.split(r"(\{\w+\})", template):
        field = part[1:-1] if part.startswith("{") else None
        if field is None:
            pattern += re.escape(part)
        elif field in seen:
            pattern += f"(?P={field})"
        else:
            seen.add(field)
            pattern += rf"(?P<{field}>\d+ \w+)" if field in ("a", "b") else rf"(?P<{field}>\w+)"
    return re.compile(pattern)


def _question(row: dict) -> str:
    (message,) = row["prompt"]
    assert message["role"] == "user"
    assert message["content"].endswith(" " + ANSWER_INSTRUCTION)
    return message["content"].removesuffix(" " + ANSWER_INSTRUCTION)


def test_arithmetic_columns_and_determinism() -> None:
    first = arithmetic_dataset(50, seed=7)
    assert first.column_names == ["prompt", "answer"]
    assert len(first) == 50
    assert first.to_list() == arithmetic_dataset(50, seed=7).to_list()
    assert first.to_list() != arithmetic_dataset(50, seed=8).to_list()


def test_arithmetic_answers_are_right() -> None:
    regexes = [(op, _template_regex(template)) for op, template in _TEMPLATES]
    ops_seen = set()
    for row in arithmetic_dataset(300, seed=1):
        question = _question(row)
        matches = [(op, m) for op, regex in regexes if (m := regex.fullmatch(question))]
        assert len(matches) == 1, f"{question!r} matches {len(matches)} templates"
        op, match = matches[0]
        a, b = (int(match[field].split()[0]) for field in ("a", "b"))
        assert 1 <= a <= 9 and 1 <= b <= 9
        assert match["name"] != match.groupdict().get("friend")
        expected = a + b if op == "+" else a - b
        assert expected >= 0, f"negative subtraction in {question!r}"
        assert row["answer"] == str(expected), question
        ops_seen.add(op)
    assert ops_seen == {"+", "-"}


def test_arithmetic_rejects_nonpositive_size() -> None:
    with pytest.raises(ValueError, match="num_examples is 0"):
        arithmetic_dataset(0)


def test_load_builtin_arithmetic() -> None:
    loaded = load_prompt_dataset("arithmetic", num_examples=12, seed=3)
    assert loaded.to_list() == arithmetic_dataset(12, seed=3).to_list()


@pytest.mark.skipif(not HAS_REASONING_GYM, reason="reasoning_gym is not installed")
def test_gsm_symbolic() -> None:
    first = load_prompt_dataset("gsm_symbolic", num_examples=4, seed=2)
    assert first.column_names == ["prompt", "answer"]
    assert first.to_list() == gsm_symbolic_dataset(4, seed=2).to_list()
    for row in first:
        assert len(_question(row)) > 20
        assert re.fullmatch(r"-?\d+(\.\d+)?", row["answer"]), row["answer"]


def test_load_jsonl_truncates_in_file_order(tmp_path) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = load_prompt_dataset(str(path), num_examples=3)
    assert loaded["prompt"] == [row["prompt"] for row in rows[:3]]
    assert loaded["answer"] == ["1", "2", "3"]
    assert len(load_prompt_dataset(str(path), num_examples=100)) == 5


def test_load_csv(tmp_path) -> None:
    path = tmp_path / "prompts.csv"
    path.write_text('prompt,answer\n"What is 2 + 2?",4\n"What is 3 - 1?",2\n')
    loaded = load_prompt_dataset(str(path))
    assert loaded["prompt"] == ["What is 2 + 2?", "What is 3 - 1?"]


def test_load_saved_folder_with_chat_prompts(tmp_path) -> None:
    source = arithmetic_dataset(6, seed=0)
    source.save_to_disk(str(tmp_path / "saved"))
    assert load_prompt_dataset(str(tmp_path / "saved")).to_list() == source.to_list()


def test_load_saved_dataset_dict_split(tmp_path) -> None:
    splits = datasets.DatasetDict(
        {"train": arithmetic_dataset(4, seed=0), "test": arithmetic_dataset(2, seed=1)}
    )
    splits.save_to_disk(str(tmp_path / "splits"))
    assert len(load_prompt_dataset(str(tmp_path / "splits"), split="test")) == 2
    with pytest.raises(ValueError, match=r"has splits \['test', 'train'\]"):
        load_prompt_dataset(str(tmp_path / "splits"), split="validation")


def test_missing_prompt_column(tmp_path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="no 'prompt' column") as info:
        load_prompt_dataset(str(path))
    message = str(info.value)
    assert "['question', 'answer']" in message
    assert "rename one of them to 'prompt'" in message


def test_empty_dataset(tmp_path) -> None:
    # num_shards=1: an empty dataset saved with zero shards cannot be loaded back at all.
    empty = datasets.Dataset.from_dict({"prompt": ["x"]}).filter(lambda row: False)
    empty.save_to_disk(str(tmp_path / "empty"), num_shards=1)
    with pytest.raises(ValueError, match="has no rows"):
        load_prompt_dataset(str(tmp_path / "empty"))


def test_empty_file(tmp_path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match="non-empty"):
        load_prompt_dataset(str(path))


def test_unreadable_folder(tmp_path) -> None:
    (tmp_path / "not_a_dataset").mkdir()
    with pytest.raises(ValueError, match="cannot read folder"):
        load_prompt_dataset(str(tmp_path / "not_a_dataset"))


def test_prompt_of_wrong_type(tmp_path) -> None:
    datasets.Dataset.from_dict({"prompt": [1, 2]}).save_to_disk(str(tmp_path / "ints"))
    with pytest.raises(ValueError, match="prompts of type int"):
        load_prompt_dataset(str(tmp_path / "ints"))


def test_missing_path(tmp_path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="does not exist"):
        load_prompt_dataset(missing)


def test_unknown_hub_name_offline() -> None:
    with pytest.raises(ValueError, match="not a built-in source") as info:
        load_prompt_dataset("no-such-org/no-such-dataset-xyz")
    assert "datasets.load_dataset failed" in str(info.value)


def test_unsupported_file_suffix(tmp_path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("What is 1 + 1?\n")
    with pytest.raises(ValueError, match="cannot read"):
        load_prompt_dataset(str(path))
