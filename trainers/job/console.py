"""What a person watches: one line per optimizer step on the console (the full metrics go to
W&B), and at the end a plot of reward and rollout throughput over the steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

_THROUGHPUT = "rollout/step_tokens_per_s"


def step_line(logs: dict, step: int, max_steps: int, step_s: float | None) -> str:
    """`[step 3/8] reward 0.62 (answer_format 0.81, exact_answer 0.44) | rollout 45 tok/s |
    staleness 0.5 | sync 0.71 s | step 31.2 s`, with what this log has."""
    parts = []
    head = f"[step {step}/{max_steps}]"
    if "reward" in logs:
        per_function = [
            f"{key.split('/')[1]} {value:.2f}"
            for key, value in sorted(logs.items())
            if key.startswith("rewards/") and key.count("/") <= 2 and not key.endswith("/std")
        ]
        detail = f" ({', '.join(per_function)})" if per_function else ""
        parts.append(f"reward {logs['reward']:.2f}{detail}")
    throughput = logs.get("rollout/step_tokens_per_s", logs.get("rollout/tokens_per_s"))
    if throughput is not None:  # the step's own (the windowed figure when it is missing)
        parts.append(f"rollout {throughput:,.0f} tok/s")
    if "rollout/staleness" in logs:
        parts.append(f"staleness {logs['rollout/staleness']:.1f}")
    if "off_policy/kl" in logs:  # KL(rollout || trainer) on the step's tokens
        parts.append(f"kl {logs['off_policy/kl']:.3f}")
    if logs.get("rollout/dropped_samples_total"):  # too stale when the trainer took them
        parts.append(f"dropped {logs['rollout/dropped_samples_total']:.0f} stale")
    if "rollout/error_samples" in logs and logs["rollout/error_samples"]:
        parts.append(f"errors {logs['rollout/error_samples']:.0f}")
    if "rollout/weight_sync_s" in logs:
        parts.append(f"sync {logs['rollout/weight_sync_s']:.2f} s")
    step_time = logs.get("perf/step_s", step_s)
    if step_time is not None:
        parts.append(f"step {step_time:.1f} s")
    return head + " " + " | ".join(parts)


def console_callback(max_steps: int):
    """A TrainerCallback printing `step_line` for each training log (evaluation and the final
    summary log have no step figures and are skipped)."""
    from transformers import TrainerCallback

    class StepLine(TrainerCallback):
        def __init__(self) -> None:
            self.last = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:
                return
            now = time.perf_counter()
            print(step_line(logs, state.global_step, max_steps, now - self.last), flush=True)
            self.last = now

    return StepLine()


class ActorDeaths:
    """A console line for each rollout actor the pool loses (the run goes on with the others,
    which generate its groups again), and the record the summary keeps of them."""

    def __init__(self, pool, current_step: Callable[[], int]) -> None:
        self.pool = pool
        self.started = time.time()
        self.num_actors = len(pool.actors)
        self._current_step = current_step
        self._steps: dict[int, int] = {}  # actor -> the optimizer step it died in
        pool.on_actor_death = self._report

    def _report(self, death) -> None:
        step = self._current_step()
        self._steps[death.actor] = step
        print(
            f"[train_grpo] rollout actor {death.actor} died at step {step} ({death.error}); "
            f"{death.live_actors} of {self.num_actors} actor(s) go on",
            flush=True,
        )

    def summary(self) -> list[dict]:
        """One entry per dead actor: which, when (seconds into the run, optimizer step), why."""
        return [
            {
                "actor": d.actor,
                "after_s": round(d.at - self.started, 1),
                "step": self._steps.get(d.actor),
                "error": d.error,
            }
            for d in self.pool.deaths
        ]


def quiet_default_printing(trainer) -> None:
    """transformers prints every log as a dict (60 keys here); the step line replaces that."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)


def training_rows(log_history: list[dict]) -> list[dict]:
    """The steps' own logs, one per optimizer step, in step order (the run's closing log, which
    repeats the last step, is left out)."""
    by_step = {}
    for e in log_history:
        if "step" in e and "train_runtime" not in e and ("reward" in e or _THROUGHPUT in e):
            by_step.setdefault(e["step"], e)
    return [by_step[step] for step in sorted(by_step)]


def plot_training(log_history: list[dict], path: Path) -> Path | None:
    """Reward and each step's rollout tokens/s over the optimizer steps, as a PNG, one point per
    step (None: nothing logged)."""
    rows = training_rows(log_history)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for key, axis, label in (
        ("reward", top, "reward (mean)"),
        (_THROUGHPUT, bottom, "rollout tokens/s (the step's)"),
    ):
        points = [(e["step"], e[key]) for e in rows if key in e]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    bottom.set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
