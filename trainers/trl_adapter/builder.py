"""The TRL trainer for a job's mode, wired to the rollout pool: what both modes share (the
sampling settings, the weight transfer and its parity probe), then the mode's own wiring.

- streaming (`streaming.py`): `AsyncGRPOTrainer` pulling scored samples from `PoolRolloutWorker`
  and sending its weights through `PoolWeightTransfer` every `weight_sync_steps`;
- sync (`sync.py`): `GRPOTrainer` whose `rollout_func` asks the pool for each step's groups,
  after a weight sync whenever the trainer has stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.engine.sampling_params import SamplingParams
from rollout.prompts import PromptFormatter
from trainers.trl_adapter.parity import ParityProbe
from trainers.trl_adapter.weight_sync import PoolWeightTransfer

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

    # The modes' modules import torch and TRL: only once a trainer is built.
    from trainers.trl_adapter import streaming, sync

    t = job.config.trainer
    probe = ParityProbe(job.pool, job.formatter.prompt_ids(job.dataset[0]["prompt"]))
    transfer = PoolWeightTransfer(job.pool, probe, job.weight_sync_backend)
    turn_tokens = job.config.environment.max_turn_tokens  # multi-turn: one model turn's limit
    sampling = SamplingParams(
        max_tokens=min(turn_tokens or t.max_completion_length, t.max_completion_length),
        temperature=t.temperature,
        n=t.num_generations,
    )
    rewards = RewardLog()
    worker = None
    if t.mode == "streaming":
        trainer, worker = streaming.trainer_for_job(job, sampling, transfer, rewards)
    else:
        trainer = sync.trainer_for_job(job, sampling, transfer)
    probe.attach(trainer.model)
    return BuiltTrainer(trainer, transfer, rewards, worker)
