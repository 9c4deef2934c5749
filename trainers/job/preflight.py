"""Everything a job needs from the user, checked before Ray starts: the model folder, LoRA's target
layers in it, the dataset, the reward functions, the environment class and the lengths (the
config's own values are checked when it is built, trainers/job/config.py; output_dir by
prepare_run_directory). A mistake is a `JobInputError` with one line that names the key and what
to change; `scripts/train_grpo.py` prints it without a traceback."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.job.config import JobConfig


class JobInputError(ValueError):
    """A user's input the job cannot run with; the message says which key and what to do."""


@dataclass
class CheckedInputs:
    model_path: str
    tokenizer: Any
    dataset: Any
    reward_funcs: list[Callable]
    dropped_prompts: int


def check_inputs(config: JobConfig) -> CheckedInputs:
    from rollout.prompts import PromptFormatter

    model_path = _model_path(config.model)
    tokenizer = _tokenizer(model_path)
    _lora_targets(config, model_path)
    _routing_replay(config, model_path)
    dataset = _dataset(config)
    reward_funcs = _rewards(config)
    _environment(config)
    dataset, dropped = _fitting_prompts(config, dataset, PromptFormatter(tokenizer))
    return CheckedInputs(model_path, tokenizer, dataset, reward_funcs, dropped)


def _model_path(model: str) -> str:
    from rollout.engine.model.loader import BUILTIN_MODEL, model_folder

    if model == BUILTIN_MODEL:
        return model_folder(model)
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        where = "is not a folder" if not path.is_dir() else "has no config.json"
        raise JobInputError(
            f"model={model}: {path} {where}. Give a local Hugging Face model folder (config.json, "
            "weights, tokenizer), or model=smollm2 for the built-in SmolLM2-135M-Instruct"
        )
    return str(path)


def _tokenizer(model_path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except Exception as err:  # noqa: BLE001 - any failure means the folder lacks a tokenizer
        raise JobInputError(
            f"model={model_path}: no tokenizer could be loaded from it ({type(err).__name__}); "
            "save the model's tokenizer into the same folder"
        ) from err


def _lora_targets(config: JobConfig, model_path: str) -> None:
    """trainer.lora's target modules name linear layers of the model the trainer will load."""
    if config.trainer.lora is None:
        return
    from trainers.job.lora_targets import lora_target_problem, meta_model

    try:
        model = meta_model(model_path)
    except Exception as err:  # noqa: BLE001 - the trainer could not build this model either
        raise JobInputError(
            f"model={config.model}: transformers cannot build a causal LM from its config "
            f"({type(err).__name__}: {err}); trainer.lora needs one"
        ) from err
    problem = lora_target_problem(config.trainer.lora, model, config.model)
    if problem is not None:
        raise JobInputError(problem)


def _routing_replay(config: JobConfig, model_path: str) -> None:
    """trainer.routing_replay needs MoE layers whose routes the engine records."""
    if not config.trainer.routing_replay:
        return
    from rollout.engine.model.route_recording import model_routers
    from trainers.job.lora_targets import meta_model

    try:
        model_routers(meta_model(model_path))
    except ValueError as err:
        raise JobInputError(
            f"trainer.routing_replay=true with model={config.model}: {err}"
        ) from err


def _dataset(config: JobConfig):
    from trainers.task.datasets import load_prompt_dataset

    try:
        return load_prompt_dataset(config.dataset.source, config.dataset.num_examples, config.seed)
    except (ValueError, RuntimeError) as err:
        raise JobInputError(f"dataset.source={config.dataset.source}: {err}") from err


def _rewards(config: JobConfig) -> list[Callable]:
    from trainers.task.rewards import get_reward_functions

    try:
        return get_reward_functions(list(config.rewards), config.reward_nan_value)
    except (ValueError, ImportError, AttributeError, TypeError, OSError) as err:
        raise JobInputError(f"rewards: {err}") from err


def _environment(config: JobConfig) -> None:
    """The environment class loads here as it will on the actors (same working directory)."""
    if config.environment.name is None:
        return
    from rollout.environments.base import load_environment

    try:
        load_environment(config.environment.name)
    except (ValueError, ImportError) as err:
        raise JobInputError(f"environment.name={config.environment.name}: {err}") from err


def _fitting_prompts(config: JobConfig, dataset, formatter) -> tuple[Any, int]:
    """Prompts the engine can extend by at least one token; the others refuse the run, or are
    dropped with a warning under dataset.drop_long_prompts."""
    limit = config.max_sample_tokens
    lengths = [len(formatter.prompt_ids(row["prompt"])) for row in dataset]
    fits = [i for i, n in enumerate(lengths) if n < limit]
    too_long = len(lengths) - len(fits)
    if not too_long:
        return dataset, 0
    longest = max(lengths)
    if not config.dataset.drop_long_prompts or not fits:
        raise JobInputError(
            f"{too_long} of {len(lengths)} prompts are too long for "
            f"rollout.engine.max_model_len={limit} (the longest has {longest} tokens, and a "
            "sample needs room for at least one new token): raise rollout.engine.max_model_len"
            + (", or set dataset.drop_long_prompts=true to train on the others" if fits else "")
        )
    warnings.warn(
        f"dataset.drop_long_prompts: dropped {too_long} of {len(lengths)} prompts longer than "
        f"rollout.engine.max_model_len={limit} - 1 tokens",
        stacklevel=2,
    )
    return dataset.select(fits), too_long
