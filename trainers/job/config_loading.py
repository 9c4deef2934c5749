"""The job's config read at the edge: defaults, then the YAML file, then `dotted.key=value`
overrides, built into the frozen dataclasses of config.py (which check every value)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path
from typing import Any

from trainers.job.config import JobConfig
from trainers.job.config_checks import ConfigError, refuse, unknown_keys


def load_config(path: str | None, overrides: list[str]) -> JobConfig:
    """Defaults, then the YAML file, then `dotted.key=value` overrides (values parsed as YAML).
    Any mistake is a `ConfigError`: one line naming the file and line, the override or the key."""
    import yaml

    values: dict[str, Any] = {}
    if path:
        values = _read_yaml_file(path)
    for item in overrides:
        key, equals, raw = item.partition("=")
        parts = key.split(".")
        if not equals or not all(parts):
            raise ConfigError(
                f"override {item!r} must look like key=value (e.g. trainer.max_steps=4)"
            )
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML ({_yaml_problem(err)}); write "
                "it as YAML, e.g. 4, 1e-6, true, [a, b] or {key: value}"
            ) from None
        target = values
        for depth, part in enumerate(parts[:-1]):
            if target.get(part) is None:
                target[part] = {}
            if not isinstance(target[part], dict):
                section = ".".join(parts[: depth + 1])
                raise ConfigError(
                    f"override {item!r}: {section} is a value, not a section with keys"
                )
            target = target[part]
        target[parts[-1]] = value
    return _build(JobConfig, values, "")


def _read_yaml_file(path: str) -> dict:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: is a folder; give a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not UTF-8 text; give a YAML file") from None
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot be read ({err.strerror})") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(err)}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return values


def _yaml_problem(err) -> str:
    """A YAML error's cause in one line (its `problem`, and what the parser was doing)."""
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    text = f"{problem} {context}" if context else problem
    return " ".join(text.split())


def _build(cls, values: dict, prefix: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in set(values) - set(known))
    if unknown:
        unknown_keys(prefix, unknown, known)
    missing = [name for name, f in known.items() if _required(f) and name not in values]
    if missing:
        raise ConfigError(
            f"{prefix}{missing[0]} is required when {prefix.rstrip('.')} is given; set it, or "
            f"{prefix.rstrip('.')}=null to leave the section out"
        )
    kwargs = {}
    for name, value in values.items():
        f = known[name]
        section, optional = _section(cls, name)
        if section is not None and value is None and optional:
            kwargs[name] = None  # an optional section left out (e.g. trainer.lora=null)
        elif section is not None:
            if value is None:  # an empty section in the file: its defaults
                value = {}
            if not isinstance(value, dict):
                refuse(prefix + name, value, f"must be a mapping (e.g. {prefix}{name}.KEY=VALUE)")
            kwargs[name] = _build(section, value, f"{prefix}{name}.")
        elif isinstance(value, dict) and f.type != "dict":
            refuse(prefix + name, value, "is a single value, not a section with keys")
        elif name == "rewards":
            kwargs[name] = (value,) if isinstance(value, str) else _tuple(value)
        elif name == "reward_weights":
            kwargs[name] = _tuple(value, _maybe_number)
        elif "tuple[" in str(f.type):
            kwargs[name] = _tuple(value)
        elif "float" in str(f.type):
            kwargs[name] = _maybe_number(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@functools.cache
def _section(cls, name: str) -> tuple[type | None, bool]:
    """The config dataclass a field holds (None for a plain value), and whether the field may be
    null: `trainer: TrainerConfig` is a section that is always there, `lora: LoraSettings | None`
    one that is there only when given."""
    hint = typing.get_type_hints(cls)[name]
    kinds = typing.get_args(hint) or (hint,)
    sections = [kind for kind in kinds if dataclasses.is_dataclass(kind)]
    return (sections[0] if sections else None), type(None) in kinds


def _tuple(value: Any, convert=lambda v: v) -> Any:
    """A YAML list as a tuple (each item converted); anything else as it is, for the checks."""
    return tuple(convert(v) for v in value) if isinstance(value, list) else value


def _maybe_number(value: Any) -> Any:
    """YAML reads `1e-5` (no dot) as a string; take it as the number it means. Anything else
    stays as it is, for the type checks to name."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
