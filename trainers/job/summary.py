"""What a finished job reports: rewards first and last, rollout throughput, weight syncs, the
step time split and memory. Written to <output_dir>/summary.json and printed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainers.job.config import JobConfig, to_dict


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
        """The sync mode's TRL scores the groups itself: take its logged mean reward per step."""
        self.groups = [
            (i, entry["reward"], 0) for i, entry in enumerate(log_history) if "reward" in entry
        ]


def job_summary(
    config: JobConfig,
    built: Any,
    actor_stats: dict[int, dict[str, float]],
    train_seconds: float,
    placement: Any,
    out: Path,
) -> dict:
    """`built`: the BuiltTrainer (trainer, weight transfer, reward log, worker)."""
    import torch

    from trainers.trl_adapter.rollout_logging import step_time_split

    trainer, transfer, rewards = built.trainer, built.transfer, built.rewards
    if config.trainer.mode == "sync":  # TRL scored the groups itself: read its logged rewards
        rewards.read_from_trl_log(trainer.state.log_history)

    tokens = sum(s["total_tokens"] for s in actor_stats.values())
    history = transfer.history
    return {
        "steps": trainer.state.global_step,
        "sequences": int(sum(s["total_sequences"] for s in actor_stats.values())),
        "rollout_tokens": int(tokens),
        "rollout_tokens_per_s": tokens / train_seconds,
        "train_seconds": train_seconds,
        "reward_mean_first": rewards.mean_at(first=True),
        "reward_mean_last": rewards.mean_at(first=False),
        "weight_syncs": len(history),
        "weight_sync_backend": placement.weight_sync_backend,
        "weight_sync_seconds": [round(h["seconds"], 3) for h in history],
        "logprob_max_abs_diff": [h.get("logprob_max_abs_diff") for h in history],
        "step_time_split_s": step_time_split(trainer.state.log_history),
        "token_budget": config.token_budget,
        "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
        "trainer_peak_memory_gib": (
            torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        ),
        "error_samples": built.error_samples,
        "wandb_dir": str(out / "wandb"),
        "mode": config.trainer.mode,
        "num_actors": placement.num_actors,
        "config": to_dict(config),
    }
