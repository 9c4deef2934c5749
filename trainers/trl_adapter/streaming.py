"""Streaming mode (`trainer.mode=streaming`, the default): TRL's `AsyncGRPOTrainer` fed by the
RolloutPool as groups finish.

`trainer_for_job` wires it: a `PoolRolloutWorker` (`rollout_worker.py`: prompts -> groups on the
pool -> rewards and group-normalised advantages -> TRL `RolloutSample`s on the trainer's queue)
and the pool's weight transfer (`weight_sync.py`), which the trainer calls every
`weight_sync_steps`.

Three things make AsyncGRPOTrainer run offline and on CPU: its peak-FLOPs probe (CUDA only, feeds
an MFU metric) is neutralised on CPU; its training attention ("tree_fa3", a Hub kernel) is
replaced after construction by `tree_attention.py`; `token_budget` is always set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollout.engine.sampling_params import SamplingParams
from trainers.trl_adapter.args import trl_args, trl_config
from trainers.trl_adapter.lora import peft_config_for
from trainers.trl_adapter.planned_lengths import planned_lengths
from trainers.trl_adapter.rollout_worker import PoolRolloutWorker
from trainers.trl_adapter.sharded import fsdp_args, pool_trainer_class
from trainers.trl_adapter.tree_attention import TREE_ATTENTION_NAME, register_tree_attention

if TYPE_CHECKING:
    from trainers.job.config import JobConfig
    from trainers.trl_adapter.builder import JobInputs, RewardLog


def trainer_for_job(job: JobInputs, sampling: SamplingParams, transfer, rewards: RewardLog):
    """The job's AsyncGRPOTrainer and the PoolRolloutWorker that feeds it; `rewards` records
    every scored group."""
    weights = job.config.reward_weights

    worker = PoolRolloutWorker(
        job.pool,
        job.dataset,
        job.formatter,
        job.reward_funcs,
        sampling,
        max_inflight_groups=job.config.trainer.prompts_per_step,
        on_group=rewards.add,
        start_cursor=job.start_cursor,
        reward_weights=list(weights) if weights is not None else None,
        environment=job.config.environment.name,
        episode_limits=job.config.episode_limits(),
        max_staleness=job.config.trainer.max_staleness,
        staleness=job.config.trainer.staleness,
        planned=planned_lengths(job.config.rollout.planned_lengths),
        bounded_admission=job.config.trainer.bounded_admission,
    )
    args = trl_args(job.config, job.out, job.on_cpu) | streaming_trl_args(job.config)
    if job.num_processes > 1:
        args |= fsdp_args()
    lora = job.config.trainer.lora
    trainer = build_async_trainer(
        job.model_path,
        job.tokenizer,
        job.dataset,
        job.reward_funcs,
        worker,
        transfer,
        args,
        peft_config=peft_config_for(lora) if lora is not None else None,
    )
    # The trainer counts weight versions like the pool: a resumed run continues them, so the
    # staleness of its samples is counted as before. Ranks other than 0 have no pool.
    trainer.model_version = job.pool.version if job.pool is not None else 0
    worker.update_model_version(trainer.model_version)
    return trainer, worker


def streaming_trl_args(config: JobConfig) -> dict:
    """What AsyncGRPOConfig takes on top of `trl_args`."""
    t = config.trainer
    return dict(
        max_staleness=t.max_staleness,
        weight_sync_steps=t.weight_sync_steps,
        token_budget=config.token_budget,
        dtype=t.dtype,
    )


def build_async_trainer(
    model_path: str,
    tokenizer,
    dataset,
    reward_funcs: list[Callable],
    worker: Any,
    transfer: Any,
    args: dict,
    peft_config=None,
):
    """AsyncGRPOTrainer (`sharded.pool_trainer_class`: its sync goes to the pool, across ranks)
    wired to a rollout worker and a weight transfer that follow TRL's protocols (the job's:
    `PoolRolloutWorker`, `weight_sync.PoolWeightTransfer`), its attention swapped for ours."""
    import torch
    from trl.experimental.async_grpo import AsyncGRPOConfig
    from trl.experimental.async_grpo import async_grpo_trainer as trainer_module

    config = trl_config(AsyncGRPOConfig, args)
    _quiet_second_step_callback()
    if not torch.cuda.is_available():
        # Feeds only the MFU metric and asks for a CUDA device: meaningless on CPU.
        trainer_module.get_peak_flops_per_device = lambda *a, **k: float("inf")  # MFU reads 0
    trainer = pool_trainer_class()(
        model=model_path,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_worker=worker,
        weight_transfer=transfer,
        peft_config=peft_config,
    )
    register_tree_attention()
    trainer.model.set_attn_implementation(TREE_ATTENTION_NAME)
    return trainer


class _SecondStepCallbackNotice(logging.Filter):
    """Drops transformers' warning that a second StepIntervalCallback is added: AsyncGRPOTrainer
    adds two on purpose (the weight sync and the step metrics, each at its own interval), and the
    warning, which lists every callback, asks nothing of the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        # the added class's name, not the list of callbacks the message goes on to give
        return "StepIntervalCallback'> to the callbacks" not in record.getMessage()


def _quiet_second_step_callback() -> None:
    callbacks_log = logging.getLogger("transformers.trainer_callback")
    if not any(isinstance(f, _SecondStepCallbackNotice) for f in callbacks_log.filters):
        callbacks_log.addFilter(_SecondStepCallbackNotice())
