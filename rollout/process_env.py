"""The process environment every entry point starts from: no hub access, no telemetry, no notices
that ask nothing of the user.

Models and datasets load from local folders only (the built-in model ships inside a package), so
a missing file is an error at once instead of a download attempt or a hang. Set before transformers,
huggingface_hub or datasets is imported: they read these at import. A value the user set wins.
"""

from __future__ import annotations

import os

DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # The tokenizers' own thread pool would fight Ray's and the trainer's workers for the cores.
    "TOKENIZERS_PARALLELISM": "false",
    # TRL warns on every run that AsyncGRPO and rollout_func are experimental: we use them on
    # purpose, at the version pyproject.toml pins, and the warning asks nothing of the user.
    "TRL_EXPERIMENTAL_SILENCE": "1",
}


def set_process_env_defaults() -> None:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
