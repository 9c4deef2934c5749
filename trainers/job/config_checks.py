"""The checks every job config value goes through when its dataclass is built: its type, read
from the field's annotation, and the ranges each section asks for. A value that fails is a
`ConfigError`: one line naming the dotted key, the value as the user wrote it, and what to change.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, NoReturn

from rollout.engine.config import EngineConfig


class ConfigError(ValueError):
    """A config value the job cannot run with: one line that names the dotted key, the value and
    what to change (`scripts/train_grpo.py` prints it without a traceback and exits 2)."""


_KINDS = {
    "int": ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a finite number", lambda v: _is_number(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "dict": ("a mapping, e.g. {max_model_len: 1024}", lambda v: isinstance(v, dict)),
    "tuple[str, ...]": (
        "a list of strings",
        lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
    ),
    "tuple[float, ...]": (
        "a list of finite numbers",
        lambda v: isinstance(v, tuple) and all(_is_number(x) for x in v),
    ),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_types(config, prefix: str) -> None:
    """Every field of a config dataclass against its annotation: `int`, `float`, `bool`, `str`,
    `dict`, tuples of str or float, a section's dataclass, or a union of them (`| None`: null
    is allowed)."""
    for f in dataclasses.fields(config):
        _check_type(prefix + f.name, getattr(config, f.name), f.type)


def _check_type(key: str, value: Any, annotation: str) -> None:
    kinds = [kind.strip() for kind in str(annotation).split("|")]
    optional = "None" in kinds
    checks = [_kind(kind) for kind in kinds if kind != "None"]
    if value is None and optional:
        return
    if not any(ok(value) for _, ok in checks):
        words = " or ".join(words for words, _ in checks)
        refuse(key, value, f"must be {words}" + (" or null" if optional else ""))


def _kind(kind: str) -> tuple[str, Any]:
    """A kind's words for the error message, and its test."""
    if kind in _KINDS:
        return _KINDS[kind]

    def ok(v):  # a section: one of the config's own dataclasses, named by its class
        return dataclasses.is_dataclass(v) and type(v).__name__ == kind

    return f"a {kind}", ok


def check_engine(engine: dict) -> None:
    """`rollout.engine`: each key as EngineConfig checks it, named as the job's key."""
    known = {f.name: f for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(str(k) for k in set(engine) - set(known))
    if unknown:
        unknown_keys("rollout.engine.", unknown, known)
    for name, value in engine.items():
        key = f"rollout.engine.{name}"
        if name in ("model", "seed"):
            refuse(key, value, f"the job sets it from the top-level key; set {name}=... instead")
        _check_type(key, value, known[name].type)
        try:
            EngineConfig(**{name: value})
        except ValueError as err:
            # The engine's words without its own key and value, which the job's key replaces.
            refuse(key, value, re.sub(r"; got .*$", "", str(err)).removeprefix(f"{name} "))
    try:
        EngineConfig(**engine)
    except ValueError as err:
        raise ConfigError(f"rollout.engine={show(engine)}: {err}") from None


# The output head's usual names: its adapter would be ignored (TRL's AsyncGRPO takes logprobs
# from the head's base weight); the model's own name for it is checked by trainers/job/lora_targets.py.
_OUTPUT_HEADS = ("lm_head",)


def check_lora_targets(targets: tuple[str, ...] | str) -> None:
    """`trainer.lora.target_modules` as a config value (the model's layers: lora_targets.py)."""
    key = "trainer.lora.target_modules"
    if isinstance(targets, str):
        if targets != "all-linear":
            refuse(key, targets, "must be all-linear or a list of names like [q_proj, v_proj]")
        return
    if not targets:
        refuse(key, targets, "give at least one module name, or all-linear")
    for entry in targets:
        not_empty(key, entry)
    heads = [entry for entry in targets if entry.split(".")[-1] in _OUTPUT_HEADS]
    if heads:
        refuse(
            key,
            targets,
            f"{', '.join(heads)} is the output head: TRL's AsyncGRPO computes logprobs from its "
            "base weight and would ignore the adapter; leave it out",
        )


def unknown_keys(prefix: str, unknown: list[str], known) -> NoReturn:
    raise ConfigError(
        f"unknown config key(s) {[prefix + k for k in unknown]}; valid keys here: "
        f"{[prefix + k for k in known]}"
    )


def refuse(key: str, value: Any, what: str) -> NoReturn:
    raise ConfigError(f"{key}={show(value)}: {what}")


def show(value: Any) -> str:
    """A value as the user would write it in an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        plain = value and value == value.strip() and "\n" not in value
        return value if plain else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        refuse(key, value, "must be " + ", ".join(choices[:-1]) + f" or {choices[-1]}")


def at_least(key: str, value: float | None, low: float, note: str = "") -> None:
    if value is not None and value < low:
        refuse(key, value, f"must be >= {low}{note}")


def not_empty(key: str, value: str) -> None:
    if not value.strip():
        refuse(key, value, "must not be empty")
