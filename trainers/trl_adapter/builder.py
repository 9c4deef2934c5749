"""The TRL trainer for a job's mode, wired to the rollout pool: what both modes share (the
sampling settings, the weight transfer and its parity probe), then the mode's own wiring.

- streaming (`streaming.py`): `AsyncGRPOTrainer` pulling scored samples from `PoolRolloutWorker`
  and sending its weights through `PoolWeightTransfer` every `weight_sync_steps`;
- sync (`sync.py`): `GRPOTrainer` whose `rollout_func` asks the pool for each step's groups,
  after a weight sync whenever the trainer has stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.engine.sampling_params import SamplingParams
from rollout.prompts import PromptFormatter
from trainers.trl_adapter.parity import ParityProbe
from trainers.trl_adapter.rank_feed import RankFeed
from trainers.trl_adapter.weight_sync import PoolWeightTransfer

if TYPE_CHECKING:  # trainers.job imports this package: no trainers.job import at run time
    from trainers.job.config import JobConfig


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
    num_processes: int = 1
    """Trainer ranks: more than one shards the model with FSDP2."""
    each_rank_syncs_its_actor: bool = False
    """Colocated ranks: rank i sends its weights to actor i (rank_feed.py)."""


@dataclass
class RewardLog:
    """Mean reward of every scored group, with the weight version it was generated under."""

    groups: list[tuple[int, float, int]] = field(default_factory=list)  # (version, reward, tokens)

    def add(self, event: dict) -> None:
        group = event["group"]
        tokens = sum(len(s.token_ids) for s in group.samples)
        self.groups.append((group.weight_versions[0], float(event["rewards"].mean()), tokens))

    def mean_at(self, first: bool) -> float | None:
        if not self.groups:
            return None
        versions = [v for v, _, _ in self.groups]
        target = min(versions) if first else max(versions)
        values = [r for v, r, _ in self.groups if v == target]
        return sum(values) / len(values)

    def read_from_trl_log(self, log_history: list[dict]) -> None:
        """trl.GRPOTrainer scores the groups itself: take its logged mean reward per step."""
        self.groups = [
            (i, entry["reward"], 0) for i, entry in enumerate(log_history) if "reward" in entry
        ]


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
        # AsyncGRPOTrainer's own (private) record of the groups it has trained on.
        return self.worker.dataset_position(self.trainer._trained_groups)

    def reward_log(self) -> RewardLog:
        """The mean reward of the groups trained on: scored by the worker in streaming mode;
        in sync mode trl.GRPOTrainer scored them itself, so they are read from its log."""
        if self.worker is None:
            self.rewards.read_from_trl_log(self.trainer.state.log_history)
        return self.rewards

    def staleness_counts(self) -> dict:
        """Streaming: samples and tokens handed to the trainer and dropped as too stale, their
        mean lengths, and the tokens' mean staleness. Sync mode drops nothing."""
        if self.worker is None:
            return {"dropped_samples": 0, "dropped_tokens": 0}
        return self.worker.rollout_buffer.counts.summary()

    @property
    def error_samples(self) -> int:
        return self.worker.error_samples if self.worker is not None else 0


def build_trainer(job: JobInputs) -> BuiltTrainer:
    # Imported here, once the job has set the environment defaults: streaming.py imports torch.
    from trainers.trl_adapter import streaming, sync

    t = job.config.trainer
    # Colocated ranks feed one actor each: the probe checks every actor, not only the first.
    feed = RankFeed() if job.each_rank_syncs_its_actor else None
    probe = ParityProbe(
        job.pool, job.formatter.prompt_ids(job.dataset[0]["prompt"]), every_actor=feed is not None
    )
    transfer = PoolWeightTransfer(job.pool, job.weight_sync_backend)
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
        trainer.parity = probe
        trainer.lora = t.lora is not None
        trainer.feed = feed
    else:
        trainer = sync.trainer_for_job(job, sampling, transfer, probe, feed)
    trainer.off_policy = (job.config.off_policy_correction, t.off_policy_cap)
    if t.routing_replay:
        from trainers.trl_adapter.replay_batches import RoutesByTokens
        from trainers.trl_adapter.routing_replay import RouteReplay

        trainer.route_replay = RouteReplay(trainer.model)
        trainer.sample_routes = RoutesByTokens()  # read in sync mode only
    probe.attach(trainer.model)
    return BuiltTrainer(trainer, transfer, rewards, worker)
