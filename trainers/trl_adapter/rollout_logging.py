"""The rollout side in the trainer's logs: actor metrics beside TRL's own in every W&B row, and
where each optimizer step's time went."""

from __future__ import annotations

import time

# TRL's streaming trainer logs where each optimizer step's wall time went.
_STEP_PARTS = {
    "step": "perf/step_s",
    "rollout_wait": "perf/rollout_wait_s",
    "train_fwd_bwd": "perf/fwd_bwd_s",
    "optimizer": "perf/optimizer_s",
    "weight_sync": "perf/weight_sync_s",
}


def step_time_split(log_history: list[dict]) -> dict[str, float] | None:
    """Median seconds per step: whole step, waiting for rollouts, training, weight sync (None in
    sync mode, whose trainer does not log these), and `other`: what of the step none of the parts
    timed (batch packing on the host, gradient clipping, GPU work the host timers did not wait
    for, logging)."""
    import statistics

    split = {}
    for part, key in _STEP_PARTS.items():
        values = [entry[key] for entry in log_history if key in entry]
        if values:
            split[part] = round(statistics.median(values), 4)
    others = [
        entry[_STEP_PARTS["step"]]
        - sum(entry.get(key, 0.0) for part, key in _STEP_PARTS.items() if part != "step")
        for entry in log_history
        if _STEP_PARTS["step"] in entry
    ]
    if others:
        split["other"] = round(statistics.median(others), 4)
    return split or None


class StepThroughput:
    """Rollout tokens per second since the previous step's log: the step's own throughput (the
    actors' windowed `tokens_per_s` averages over 30 s, which a slow step outlasts)."""

    def __init__(self) -> None:
        self._at = time.monotonic()
        self._totals: dict[int, float] = {}  # actor -> total_tokens at the last step log

    def update(self, stats: dict[int, dict[str, float]]) -> float:
        now = time.monotonic()
        # Per actor, so an actor that dies (and leaves the stats) takes nothing back.
        tokens = sum(
            max(0.0, values["total_tokens"] - self._totals.get(actor, 0.0))
            for actor, values in stats.items()
        )
        rate = tokens / (now - self._at) if now > self._at else 0.0
        self._at = now
        self._totals.update({actor: values["total_tokens"] for actor, values in stats.items()})
        return rate


def attach_rollout_logging(trainer, pool, transfer) -> None:
    """Add the actors' rollout metrics (per actor and summed/averaged), the step's own rollout
    throughput and the live actors to every trainer log, so W&B shows them beside TRL's own in
    one run; an actor's death shows as `rollout/actor_died` (its id) in the next log."""
    original = trainer.log
    throughput = StepThroughput()
    deaths_logged = 0

    def log(logs: dict, *args, **kwargs):
        nonlocal deaths_logged
        try:
            stats = pool.actor_metrics()
        except Exception:  # noqa: BLE001 - metrics must never stop training
            stats = {}
        for actor, values in stats.items():
            for key, value in values.items():
                logs[f"rollout/actor{actor}/{key}"] = value
        if stats:
            for key in ("tokens_per_s", "running_sequences", "preemptions", "total_tokens"):
                logs[f"rollout/{key}"] = sum(v[key] for v in stats.values())
            averaged = ("gpu_busy", "cpu_ms_per_step", "kv_cache_use", "latency_s", "queue_wait_s")
            speculation = ("spec_acceptance_rate", "spec_tokens_per_verification")
            for key in averaged + speculation:
                present = [v[key] for v in stats.values() if key in v]
                if present:
                    logs[f"rollout/{key}"] = sum(present) / len(present)
            if "train_runtime" not in logs:  # a step's log, not the run's closing one
                logs["rollout/step_tokens_per_s"] = throughput.update(stats)
        logs["rollout/live_actors"] = len(pool.actors) - len(pool.dead)
        if len(pool.deaths) > deaths_logged:
            logs["rollout/actor_died"] = pool.deaths[-1].actor
            deaths_logged = len(pool.deaths)
        if transfer.history:
            last = transfer.history[-1]
            logs["rollout/weight_sync_s"] = last["seconds"]
            logs["rollout/weight_sync_bytes"] = last["bytes"]
            if last.get("logprob_max_abs_diff") is not None:
                logs["rollout/logprob_max_abs_diff"] = last["logprob_max_abs_diff"]
        return original(logs, *args, **kwargs)

    trainer.log = log
