"""Everything that touches TRL lives here (tested with trl==1.16.0, pinned in pyproject.toml).

- streaming (default): `trl.experimental.async_grpo.AsyncGRPOTrainer` with our rollout worker
  and weight transfer (`trainers.trl_adapter.streaming`: the RolloutPool behind them), whose
  samples are TRL's `RolloutSample`s (`rollout_sample`);
- synchronous fallback: `trl.GRPOTrainer(rollout_func=...)` backed by the same pool, with a weight
  sync before each generation (`trainers.trl_adapter.sync`).
Three things make AsyncGRPOTrainer run offline and on CPU: its peak-FLOPs probe (CUDA only, feeds
an MFU metric) is neutralised on CPU; its training attention ("tree_fa3", a Hub kernel) is
replaced after construction by `trainers.trl_adapter.tree_attention`; `token_budget` is always set.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from trainers.trl_adapter.tree_attention import TREE_ATTENTION_NAME, register_tree_attention

TRL_VERSION = "1.16.0"


def rollout_sample(
    prompt,
    completion,
    prompt_ids: list[int],
    completion_ids: list[int],
    logprobs: list[float],
    advantage: float,
    version: int,
    group_id: int,
    metrics: dict,
    completion_mask: list[int] | None = None,
):
    """One TRL `RolloutSample`: the loss covers the completion tokens (those of
    `completion_mask`, when a multi-turn episode interleaves the environment's), scored with the
    actor's logprobs (the prompt's are never used)."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    prompt_len, completion_len = len(prompt_ids), len(completion_ids)
    mask = completion_mask if completion_mask is not None else [1] * completion_len
    assert len(mask) == completion_len, "one mask entry per completion token"
    return RolloutSample(
        prompt=prompt,
        completion=completion,
        input_ids=np.array(prompt_ids + completion_ids, dtype=np.int64),
        completion_mask=np.array([0] * prompt_len + list(mask), dtype=np.int64),
        old_log_probs=np.array([0.0] * prompt_len + list(logprobs), dtype=np.float32),
        advantage=advantage,
        model_version=version,
        group_id=group_id,
        metrics=dict(metrics),
        enqueued_at=time.time(),
    )


def build_async_trainer(
    model_path: str,
    tokenizer,
    dataset,
    reward_funcs: list[Callable],
    worker: Any,
    transfer: Any,
    args: dict,
):
    """AsyncGRPOTrainer wired to a rollout worker and a weight transfer that follow TRL's
    protocols (the job's: `trainers.trl_adapter.streaming`), its attention swapped for ours."""
    import torch
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo import async_grpo_trainer as trainer_module

    config = _one_trainer_gpu(AsyncGRPOConfig(**_checkpointing_by_its_name(args)))
    if not torch.cuda.is_available():
        # Feeds only the MFU metric and asks for a CUDA device: meaningless on CPU.
        trainer_module.get_peak_flops_per_device = lambda *a, **k: float("inf")  # MFU reads 0
    trainer = AsyncGRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_worker=worker,
        weight_transfer=transfer,
    )
    register_tree_attention()
    trainer.model.set_attn_implementation(TREE_ATTENTION_NAME)
    return trainer


def build_sync_trainer(model_path: str, tokenizer, dataset, reward_funcs, rollout_func, args: dict):
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=_one_trainer_gpu(GRPOConfig(**_checkpointing_by_its_name(args))),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


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
