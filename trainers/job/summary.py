"""What a finished job reports: rewards first and last, rollout throughput, weight syncs, the
step time split and memory. Written to <output_dir>/summary.json and printed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainers.job.config import JobConfig, to_dict


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

    from trainers.trl_adapter import step_time_split

    trainer, transfer, rewards = built.trainer, built.transfer, built.reward_log()

    tokens = sum(s["total_tokens"] for s in actor_stats.values())
    history = transfer.history
    steps = max(1, trainer.state.global_step)
    lora = config.trainer.lora
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
        # One sync's bytes (an adapter's with LoRA), and the syncs' time spread over the steps.
        "weight_sync_bytes": history[-1]["bytes"] if history else 0,
        "weight_sync_seconds_per_step": round(sum(h["seconds"] for h in history) / steps, 4),
        "trainer_processes": placement.num_processes,
        "layout": placement.layout,
        "placement": placement.summary()["seats"],
        "lora": (
            None if lora is None else {**dataclasses.asdict(lora), "alpha": lora.effective_alpha}
        ),
        "logprob_max_abs_diff": [h.get("logprob_max_abs_diff") for h in history],
        "step_time_split_s": step_time_split(trainer.state.log_history),
        "token_budget": config.token_budget,
        "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
        "trainer_peak_memory_gib": (
            torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        ),
        "actor_gpu_memory_gib": max(
            (s["gpu_memory_gib"] for s in actor_stats.values() if "gpu_memory_gib" in s),
            default=None,
        ),
        "error_samples": built.error_samples,
        "staleness_rule": config.trainer.staleness if config.trainer.mode == "streaming" else None,
        "off_policy_correction": config.off_policy_correction,
        "weight_quantization": config.rollout.engine.get("weight_quantization", "none"),
        "kv_cache_dtype": config.rollout.engine.get("kv_cache_dtype", "auto"),
        "activation_quantization": config.rollout.engine.get("activation_quantization", "none"),
        "fp8_lm_head": config.rollout.engine.get("fp8_lm_head", False),
        "off_policy": off_policy_figures(trainer.state.log_history),
        "routing_replay": config.trainer.routing_replay,
        "routing_flipped_fraction": logged_mean(
            trainer.state.log_history, "routing/flipped_fraction"
        ),
        **built.staleness_counts(),
        "wandb_dir": str(out / "wandb"),
        "mode": config.trainer.mode,
        "num_actors": placement.num_actors,  # started; actors_at_end and actor_deaths follow
        "config": to_dict(config),
    }


def logged_mean(log_history: list[dict], key: str) -> float | None:
    """The mean of a per-step figure over the run (None when it was never logged)."""
    values = [entry[key] for entry in log_history if entry.get(key) is not None]
    return sum(values) / len(values) if values else None


def off_policy_figures(log_history: list[dict]) -> dict | None:
    """The rollout/trainer mismatch over the run from each step's `off_policy/*` log: the mean
    of each figure, and the largest ratio seen (None when nothing was logged)."""
    keys = sorted({k for entry in log_history for k in entry if k.startswith("off_policy/")})
    if not keys:
        return None
    figures = {}
    for key in keys:
        values = [entry[key] for entry in log_history if entry.get(key) is not None]
        name = key.split("/", 1)[1]
        figures[name] = max(values) if name.endswith("_max") else sum(values) / len(values)
    return figures
