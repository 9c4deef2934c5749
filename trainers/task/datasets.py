"""Prompt datasets for GRPO: built-in generated math problems, local files, or cached hub datasets.

Every dataset returned here has a ``prompt`` column (plain strings or chat lists) and, for the
built-in generators, an ``answer`` column that ``trainers.task.rewards.exact_answer`` checks against.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

ANSWER_INSTRUCTION = "Give the final answer on the last line as 'Answer: <number>'."
DEFAULT_NUM_GENERATED = 1000  # built-in generators' size when num_examples is None
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

_NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal")
# (singular, plural), so "1 apple" and "3 apples" both read naturally.
_OBJECTS = (
    ("apple", "apples"), ("marble", "marbles"), ("pencil", "pencils"), ("cookie", "cookies"),
    ("sticker", "stickers"), ("shell", "shells"), ("book", "books"), ("balloon", "balloons"),
)  # fmt: skip
# (operation, template). {a} and {b} expand to counted objects ("3 apples"), {objects} to the
# plural. Module-level so tests can match questions back to their template.
_TEMPLATES = (
    ("+", "{name} has {a}. {friend} gives {name} {b}. How many {objects} does {name} have now?"),
    ("+", "There are {a} in a box. {name} adds {b}. How many {objects} are in the box now?"),
    ("+", "{name} found {a} on Monday and {b} on Tuesday. How many {objects} did {name} find?"),
    ("-", "{name} has {a} and gives {b} to {friend}. How many {objects} does {name} have left?"),
    ("-", "There are {a} on a table. {name} takes away {b}. How many {objects} are still there?"),
    ("-", "{name} bought {a} and lost {b} on the way home. How many {objects} are left?"),
)


def _count(n: int, obj: tuple[str, str]) -> str:
    return f"{n} {obj[0] if n == 1 else obj[1]}"


def _user_prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} {ANSWER_INSTRUCTION}"}]


def _check_num_examples(num_examples: int) -> None:
    if num_examples < 1:
        raise ValueError(f"num_examples is {num_examples}; it must be at least 1")


def arithmetic_dataset(num_examples: int, seed: int = 0) -> datasets.Dataset:
    """Single-digit addition/subtraction word problems; the same seed gives the same rows."""
    import datasets

    _check_num_examples(num_examples)
    rng = random.Random(seed)
    prompts, answers = [], []
    for _ in range(num_examples):
        op, template = rng.choice(_TEMPLATES)
        name, friend = rng.sample(_NAMES, 2)
        obj = rng.choice(_OBJECTS)
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if op == "-" and b > a:
            a, b = b, a  # subtraction never goes below zero
        question = template.format(
            name=name, friend=friend, a=_count(a, obj), b=_count(b, obj), objects=obj[1]
        )
        prompts.append(_user_prompt(question))
        answers.append(str(a + b if op == "+" else a - b))
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": answers})


def gsm_symbolic_dataset(num_examples: int, seed: int = 0) -> datasets.Dataset:
    """GSM8K-like problems from reasoning_gym's ``gsm_symbolic`` task, in the same columns."""
    import datasets

    _check_num_examples(num_examples)
    try:
        import reasoning_gym
    except ImportError as err:
        raise RuntimeError(
            "source 'gsm_symbolic' needs the reasoning_gym package; pip install reasoning-gym"
        ) from err
    task = reasoning_gym.create_dataset("gsm_symbolic", size=num_examples, seed=seed)
    rows = [task[i] for i in range(num_examples)]
    return datasets.Dataset.from_dict(
        {
            "prompt": [_user_prompt(row["question"]) for row in rows],
            "answer": [str(row["answer"]) for row in rows],
        }
    )


BUILTIN_SOURCES = {"arithmetic": arithmetic_dataset, "gsm_symbolic": gsm_symbolic_dataset}


def _looks_like_path(source: str) -> bool:
    # Hub names are "name" or "org/name"; anything else that does not exist is a mistyped path.
    path = Path(source)
    return (
        path.is_absolute()
        or source.startswith((".", "~"))
        or path.suffix in DATA_FILE_BUILDERS
        or len(path.parts) > 2
    )


def _load_local(path: Path, split: str) -> Any:
    import datasets

    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as err:  # e.g. FileNotFoundError, or IndexError for zero saved shards
            raise ValueError(
                f"cannot read folder {path} with datasets.load_from_disk "
                f"({type(err).__name__}: {err}); save it with save_to_disk and at least one row"
            ) from err
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{path} has splits {sorted(loaded)}; pass one of them as split")
            return loaded[split]
        return loaded
    builder = DATA_FILE_BUILDERS.get(path.suffix)
    if builder is None:
        raise ValueError(
            f"cannot read {path}: use a folder saved with save_to_disk or a file ending in "
            f"{', '.join(DATA_FILE_BUILDERS)}"
        )
    try:
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
    except Exception as err:  # an empty json file raises StopIteration, an empty csv ValueError
        raise ValueError(
            f"cannot read {path} as {builder} ({type(err).__name__}: {err}); "
            "check that the file is non-empty and well-formed"
        ) from err


def _load_hub(source: str, split: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(source, split=split)
    except Exception as err:  # load_dataset raises many types; all mean "not loadable here"
        raise ValueError(
            f"cannot load {source!r}: it is not a built-in source {sorted(BUILTIN_SOURCES)}, "
            f"not an existing local file or folder, and datasets.load_dataset failed "
            f"(hub datasets must already be cached): {err}"
        ) from err


def _check_prompts(dataset: Any, source: str) -> None:
    # Emptiness first: an empty file has no columns at all, and "no prompt column" would mislead.
    if len(dataset) == 0:
        raise ValueError(f"dataset {source!r} has no rows; give a dataset with at least one prompt")
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"dataset {source!r} has no 'prompt' column; its columns are {dataset.column_names}; "
            "rename one of them to 'prompt'"
        )
    # Arrow columns have one type, so the first row tells whether the column is usable.
    first = dataset[0]["prompt"]
    is_chat = isinstance(first, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in first
    )
    if not (isinstance(first, str) or is_chat):
        raise ValueError(
            f"dataset {source!r} has prompts of type {type(first).__name__}; each prompt must be "
            "a string or a chat list of {'role': ..., 'content': ...} messages"
        )


def load_prompt_dataset(
    source: str, num_examples: int | None = None, seed: int = 0, split: str = "train"
) -> datasets.Dataset:
    """A prompt dataset from a built-in generator, a local path, or a cached hub dataset name.

    ``source`` is "arithmetic" or "gsm_symbolic" (generated from ``seed``; ``num_examples``
    defaults to DEFAULT_NUM_GENERATED), a folder saved with ``save_to_disk``, a .json/.jsonl/
    .csv/.parquet file, or a hub name. For loaded data ``num_examples`` keeps at most that many
    rows in file order, so the same source always gives the same rows.
    """
    if num_examples is not None:
        _check_num_examples(num_examples)
    if source in BUILTIN_SOURCES:
        return BUILTIN_SOURCES[source](num_examples or DEFAULT_NUM_GENERATED, seed)
    path = Path(source).expanduser()
    if path.exists():
        dataset = _load_local(path, split)
    elif _looks_like_path(source):
        raise ValueError(
            f"{source!r} does not exist; give an existing file or folder, a built-in source "
            f"{sorted(BUILTIN_SOURCES)}, or a cached hub dataset name"
        )
    else:
        dataset = _load_hub(source, split)
    _check_prompts(dataset, source)
    if num_examples is not None:
        dataset = dataset.select(range(min(num_examples, len(dataset))))
    return dataset
