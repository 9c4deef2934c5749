"""The TRL trainer for a job's mode, wired to the rollout pool.

- streaming: `AsyncGRPOTrainer` pulling scored samples from `PoolRolloutWorker` and sending its
  weights through `PoolWeightTransfer` every `weight_sync_steps`;
- sync: `GRPOTrainer` whose `rollout_func` asks the pool for each step's groups, after a weight
  sync whenever the trainer has stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.engine.sampling_params import SamplingParams
from rollout.prompts import PromptFormatter
from trainers.trl_adapter.parity import ParityProbe

if TYPE_CHECKING:  # trainers.job imports this module: at run time, only inside functions
    from trainers.job.config import JobConfig
    from trainers.job.summary import RewardLog


@dataclass
class JobInputs:
    """What both modes build their trainer from."""

    config: JobConfig
    out: Path
    model_path: str
    tokenizer: Any
    dataset: Any
    reward_funcs: list[Callable]
    formatter: PromptFormatter
    pool: Any
    weight_sync_backend: str
    on_cpu: bool
    start_cursor: int = 0
    """The dataset row to start from (a resumed run's saved position)."""


@dataclass
class BuiltTrainer:
    trainer: Any
    transfer: Any
    """PoolWeightTransfer: its `history` holds every sync's time and logprob parity."""
    rewards: RewardLog
    worker: Any = None
    """Streaming mode's PoolRolloutWorker (None in sync mode)."""

    def dataset_position(self) -> int | None:
        """The dataset row a resumed run starts from (None: the trainer's own data loader
        keeps the position, as in sync mode)."""
        if self.worker is None:
            return None
        return self.worker.dataset_position(self.trainer._trained_groups)

    @property
    def error_samples(self) -> int:
        return self.worker.error_samples if self.worker is not None else 0


def build_trainer(job: JobInputs) -> BuiltTrainer:
    from trainers.job.summary import RewardLog
    from trainers.trl_adapter import streaming

    t = job.config.trainer
    probe = ParityProbe(job.pool, job.formatter.prompt_ids(job.dataset[0]["prompt"]))
    transfer = streaming.PoolWeightTransfer(job.pool, probe, job.weight_sync_backend)
    turn_tokens = job.config.environment.max_turn_tokens  # multi-turn: one model turn's limit
    sampling = SamplingParams(
        max_tokens=min(turn_tokens or t.max_completion_length, t.max_completion_length),
        temperature=t.temperature,
        n=t.num_generations,
    )
    rewards = RewardLog()
    worker = None
    if t.mode == "streaming":
        trainer, worker = _streaming_trainer(job, sampling, transfer, rewards)
    else:
        trainer = _sync_trainer(job, sampling, transfer)
    probe.attach(trainer.model)
    return BuiltTrainer(trainer, transfer, rewards, worker)


def _streaming_trainer(job: JobInputs, sampling: SamplingParams, transfer, rewards: RewardLog):
    from trainers.trl_adapter import construction, streaming

    weights = job.config.reward_weights

    worker = streaming.PoolRolloutWorker(
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
    )
    args = trl_args(job.config, job.out, job.on_cpu) | streaming_trl_args(job.config)
    trainer = construction.build_async_trainer(
        job.model_path, job.tokenizer, job.dataset, job.reward_funcs, worker, transfer, args
    )
    return trainer, worker


def _sync_trainer(job: JobInputs, sampling: SamplingParams, transfer):
    from trainers.trl_adapter import construction, sync

    config, t = job.config, job.config.trainer
    before_generation = sync.WeightsBeforeGeneration(transfer)
    rollout_func = sync.make_rollout_func(
        job.pool,
        job.formatter,
        sampling,
        before_generation,
        environment=config.environment.name,
        rows=job.dataset if config.environment.name else None,
        episode_limits=config.episode_limits(),
    )
    samples = t.prompts_per_step * t.num_generations
    args = trl_args(config, job.out, job.on_cpu) | dict(
        per_device_train_batch_size=config.sync_micro_batch,
        gradient_accumulation_steps=samples // config.sync_micro_batch,
        model_init_kwargs={"dtype": t.dtype},
    )
    if config.reward_weights is not None:
        args["reward_weights"] = list(config.reward_weights)
    return construction.build_sync_trainer(
        job.model_path, job.tokenizer, job.dataset, job.reward_funcs, rollout_func, args
    )


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


def streaming_trl_args(config: JobConfig) -> dict:
    """What AsyncGRPOConfig takes on top of `trl_args`."""
    t = config.trainer
    return dict(
        max_staleness=t.max_staleness,
        weight_sync_steps=t.weight_sync_steps,
        token_budget=config.token_budget,
        dtype=t.dtype,
    )
