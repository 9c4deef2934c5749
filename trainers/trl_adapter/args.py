"""The arguments both modes' TRL trainers share, from the job config, and the two fix-ups every
TRL config object gets before a trainer is built from it. Each mode adds its own arguments
(`streaming.streaming_trl_args`, `sync.sync_trl_args`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # trainers.job imports this package: at run time, only inside functions
    from trainers.job.config import JobConfig


def trl_args(config: JobConfig, out: Path, on_cpu: bool) -> dict:
    """The TRL trainer arguments both modes share (the sync mode then sets its own batching)."""
    t = config.trainer
    samples = t.prompts_per_step * t.num_generations  # per optimizer step
    return dict(
        output_dir=str(out),
        max_steps=t.max_steps,
        learning_rate=t.learning_rate,
        # Samples per forward x forwards per step = the step's samples. Streaming packs rows
        # by token_budget instead; TRL reads this product for its own step bookkeeping.
        per_device_train_batch_size=max(1, samples // config.gradient_accumulation_steps),
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=t.num_generations,
        max_completion_length=t.max_completion_length,
        temperature=t.temperature,
        logging_steps=t.logging_steps,
        report_to=[] if config.wandb.mode == "disabled" else ["wandb"],
        run_name=out.name,
        seed=config.seed,
        # Checkpoints: transformers' own (model, optimizer, scheduler, step, RNG states); the
        # rollout side's state is added by trainers.job.checkpoints.
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 1,
        save_total_limit=t.save_total_limit,
        bf16=t.dtype == "bfloat16",
        gradient_checkpointing=t.gradient_checkpointing,
        use_cpu=on_cpu,
    )


def trl_config(config_class, args: dict):
    """`config_class(**args)` (GRPOConfig, AsyncGRPOConfig), fixed up for this installation and
    for a trainer that shares the machine with the rollout actors."""
    return _one_trainer_gpu(config_class(**_checkpointing_by_its_name(args)))


def _checkpointing_by_its_name(args: dict) -> dict:
    """transformers renamed `gradient_checkpointing` to `activation_checkpointing` (the old name
    warns); 5.17 knows only the old one. Use the name the installed version has."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "gradient_checkpointing" not in args or "activation_checkpointing" not in fields:
        return args
    renamed = dict(args)
    renamed["activation_checkpointing"] = renamed.pop("gradient_checkpointing")
    return renamed


def _one_trainer_gpu(config):
    """Train on cuda:0 alone. transformers' Trainer wraps the model in DataParallel over every
    visible GPU of a single process; the other GPUs belong to the rollout actors."""
    import torch

    if torch.cuda.device_count() > 1 and not config.use_cpu:
        _ = config.device  # resolves the device (and the GPU count, which we then override)
        config._n_gpu = 1
    return config
