"""The process environment every entry point starts from: no hub access, no telemetry.

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
}


def set_process_env_defaults() -> None:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
