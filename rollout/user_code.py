"""Load what a user names in a config: "package.module:attribute" or "path/to/file.py:attribute".

Rewards (trainers/task/reward_loading.py) and environments (rollout/environments/) are named this way.
A relative file path resolves against the current directory. Each file is loaded once, as its own
module under a name no import can clash with, so two entries from one file share its state.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FORMS = "'package.module:name' or 'path/to/file.py:name'"


def split_entry(entry: str, kind: str) -> tuple[str, str]:
    """(module or file, attribute) of an entry; ValueError naming what to change."""
    target, colon, attribute = entry.rpartition(":")
    if not colon or not target or not attribute:
        raise ValueError(f"{kind} {entry!r}: give both sides of the ':', as in {FORMS}")
    return target, attribute


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def load_module(entry: str, target: str, kind: str) -> ModuleType:
    return (
        _from_file(entry, target, kind)
        if is_file_target(target)
        else _from_import(entry, target, kind)
    )


def _from_import(entry: str, target: str, kind: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ImportError as err:
        raise ValueError(
            f"{kind} {entry!r}: cannot import module {target!r} ({err}); check the spelling, "
            "that its package is installed or on PYTHONPATH, or give a file as "
            f"'path/to/file.py:{entry.rpartition(':')[2]}'"
        ) from err


def _from_file(entry: str, target: str, kind: str) -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    path = path.resolve()
    if not path.is_file():
        raise ValueError(
            f"{kind} {entry!r}: file {path} not found (a relative path resolves against the "
            f"current directory, {Path.cwd()}); fix the path or run from the folder it is "
            "relative to"
        )
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"_user_file_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{kind} {entry!r}: {path} cannot be loaded as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # A file that failed to run is not cached, so the next attempt (once fixed) runs it again.
        del sys.modules[name]
        raise
    return module
