"""Load a transformers causal LM and its tokenizer; resolve "auto" device and dtype."""

from __future__ import annotations

from pathlib import Path

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is visible; use device='cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return TORCH_DTYPES[name]


def load_model(
    path: str, dtype: torch.dtype, device: torch.device, load_format: str = "auto"
) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format == "dummy":
        try:
            config = AutoConfig.from_pretrained(path)
        except OSError as err:
            raise ValueError(
                f"load_format='dummy' needs {path!r} to hold a config.json: {err}"
            ) from err
        with torch.device(device):  # initialised where it runs: an 8B model in seconds
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as err:
        why = str(err).rstrip(". ") if Path(path).is_dir() else "not a local folder"
        raise ValueError(
            f"could not load model {path!r}: {why}. Give a local folder with config.json and "
            f"weights (models are not downloaded: HF_HUB_OFFLINE=1), or model={BUILTIN_MODEL!r} "
            "for the built-in SmolLM2-135M-Instruct"
        ) from err
    return model.to(device)


BUILTIN_MODEL = "smollm2"


def model_folder(model: str) -> str:
    """EngineConfig.model as a path: the built-in SmolLM2-135M-Instruct's folder for
    BUILTIN_MODEL (unpacked from its package on first use), else `model` itself."""
    if model != BUILTIN_MODEL:
        return model
    from rollout.builtin_models import smollm2_path

    return str(smollm2_path())


def load_tokenizer(path: str):
    """The model folder's tokenizer, or None when it has none (prompts must then be token ids)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError):
        return None


def decoder_layers(model: torch.nn.Module, setting: str) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM; `setting` names the option to turn off."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__}; set {setting}=False"
        )
    return list(layers)


def eos_token_ids_of(model, tokenizer) -> frozenset[int]:
    """The token ids that end a sample: the generation config's (else the model config's) and
    the tokenizer's."""
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None) if generation_config else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
