"""Streaming mode's rollout worker: the RolloutPool's groups, scored, as TRL `RolloutSample`s on
AsyncGRPOTrainer's queue (a `staleness.StalenessGate`), and which prompts to start next."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rollout.engine.sampling_params import SamplingParams
from rollout.prompts import PromptFormatter
from trainers.task.reward_loading import RewardFunctionError
from trainers.task.scoring import score_group
from trainers.trl_adapter.planned_lengths import PlannedLengths
from trainers.trl_adapter.replay_batches import SAMPLE_ROUTES
from trainers.trl_adapter.staleness import StalenessGate, group_versions, trl_version


class PoolRolloutWorker:
    """AsyncGRPOTrainer's rollout worker, backed by a RolloutPool.

    Keeps at most `max_inflight_groups` groups generating (on demand, so samples stay fresh),
    scores each completed group and pushes one RolloutSample per sample into `rollout_buffer`.
    A sample that ended in an error (finish_reason "error") is counted and never trained on; if
    the first group's samples all end in errors, the worker stops with the first one's message.
    `rollout_buffer` is a `staleness.StalenessGate`: each sample carries its version by the
    `staleness` rule, and one too old when the trainer takes it is dropped and counted there.
    """

    def __init__(
        self,
        pool,
        dataset,
        formatter: PromptFormatter,
        reward_funcs: list[Callable],
        sampling: SamplingParams,
        max_inflight_groups: int,
        on_group: Callable[[dict], None] | None = None,
        start_cursor: int = 0,
        reward_weights: list[float] | None = None,
        environment: str | None = None,
        episode_limits=None,
        max_staleness: int = 2,
        staleness: str = "group_last_token",
        planned: PlannedLengths | None = None,
        bounded_admission: bool = False,
    ) -> None:
        self.pool = pool
        self.dataset = dataset
        self.formatter = formatter
        self.reward_funcs = reward_funcs
        self.sampling = sampling
        self.max_inflight_groups = max_inflight_groups
        self.on_group = on_group
        self.metrics_queue: queue.Queue = queue.Queue()
        self.staleness = staleness
        self.max_staleness = max_staleness
        self.bounded_admission = bounded_admission
        """Hold new prompts while they would reach the trainer too late (StalenessGate.admits)."""
        self.planned = planned
        """Benchmark mode: each sample's length drawn in advance (planned_lengths.py)."""
        self.model_version = 0
        self.rollout_buffer = StalenessGate(
            max_staleness, lambda: self.model_version, self.metrics_queue
        )
        self.reward_weights = reward_weights
        self.environment = environment
        """Multi-turn: each group's episodes run this environment on its row (rollout side)."""
        self.episode_limits = episode_limits
        self.start_cursor = start_cursor  # the dataset row of this run's group 0 (resume)
        self.cursor = start_cursor  # next dataset row to submit
        self.good_samples = 0
        self.error_samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_progress = time.time()

    # -- RolloutWorkerProtocol
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trl-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        if isinstance(self._error, RewardFunctionError):
            # The user's reward failed: the error names it and holds its traceback. Raised as it
            # is, so train_grpo.py reports it in one line instead of a generic wrapper's chain.
            raise self._error
        if self._error is not None:
            raise RuntimeError("rollout worker failed") from self._error
        if time.time() - self._last_progress > stale_after_s:
            raise RuntimeError(f"no rollout finished in {stale_after_s:.0f} s")

    # -- the loop
    def _run(self) -> None:
        rows: dict[int, dict] = {}
        try:
            while not self._stop.is_set():
                while (
                    len(rows) < self.max_inflight_groups
                    and self.rollout_buffer.qsize() < self.max_inflight_groups * self.sampling.n
                    and self._admits(len(rows))
                ):
                    row = self.dataset[self.cursor % len(self.dataset)]
                    self.cursor += 1
                    if self.environment is None:
                        params = self.sampling
                        if self.planned is not None:
                            params = self.planned.params_for(params)
                        group_id = self.pool.submit(
                            self.formatter.prompt_ids(row["prompt"]), params
                        )
                    else:  # the environment's reset gives the prompt, on the actor
                        group_id = self.pool.submit(
                            [], self.sampling, environment=self.environment, row=dict(row),
                            limits=self.episode_limits,
                        )  # fmt: skip
                    rows[group_id] = row
                try:
                    group = self.pool.get(timeout=0.2)
                except queue.Empty:
                    continue
                row = rows.pop(group.group_id)
                for sample, version, tokens in self._samples(group, row):
                    self.rollout_buffer.put_sample(sample, version, tokens)
                self._last_progress = time.time()
        except BaseException as err:  # noqa: BLE001 - surfaced by check_health
            self._error = err

    def _admits(self, groups_in_flight: int) -> bool:
        if not self.bounded_admission:
            return True
        n = self.sampling.n
        return self.rollout_buffer.admits(n, groups_in_flight * n, self.max_staleness)

    def dataset_position(self, trained_groups: set[int]) -> int:
        """The dataset row of the first group not trained on yet (groups are numbered in
        submission order from this run's start): where a resumed run starts."""
        first_untrained = next(g for g in itertools.count() if g not in trained_groups)
        return self.start_cursor + first_untrained

    def _usable(self, group) -> list:
        """The group's samples that can be trained on; error samples are counted and dropped."""
        errors = [s for s in group.samples if s.finish_reason == "error"]
        self.error_samples += len(errors)
        good = [s for s in group.samples if s.finish_reason != "error"]
        self.good_samples += len(good)
        if errors and not self.good_samples:
            raise RuntimeError(
                f"every rollout sample so far ended in an error; the first: {errors[0].error}"
            )
        return good

    def _samples(self, group, row: dict) -> list[tuple[Any, float, int]]:
        """The group's trainable samples as (RolloutSample, version by the staleness rule,
        completion tokens)."""
        usable = self._usable(group)
        self.metrics_queue.put({"rollout/error_samples": float(len(group.samples) - len(usable))})
        if len(usable) < 2:  # no advantage without two samples to compare
            return []
        completions = [self.formatter.completion(s.token_ids, row["prompt"]) for s in usable]
        columns = {k: [v] * len(completions) for k, v in row.items() if k != "prompt"}
        if self.environment is not None:
            columns["env_reward"] = [s.reward for s in usable]
        scored = score_group(
            [row["prompt"]] * len(completions),
            completions,
            [s.token_ids for s in usable],
            columns,
            self.reward_funcs,
            self.reward_weights,
        )
        version = group.weight_versions[0]
        metrics = {
            "reward": float(scored.rewards.mean()),
            "reward_std": float(scored.rewards.std()),
        }
        for name, values in scored.per_function.items():
            metrics[f"rewards/{name}"] = float(np.nanmean(values))
        if self.environment is not None:
            metrics["episodes/turns"] = float(np.mean([s.num_turns for s in usable]))
            metrics["episodes/done"] = float(np.mean([s.episode_status == "done" for s in usable]))
        samples = []
        versions = group_versions(usable, self.staleness)
        for s, completion, advantage, own in zip(
            usable, completions, scored.advantages, versions, strict=True
        ):
            sample = rollout_sample(
                row["prompt"],
                completion,
                s.prompt_token_ids,
                s.token_ids,
                s.logprobs,
                float(advantage),
                trl_version(own),
                group.group_id,
                metrics,
                completion_mask=s.completion_mask,
                routes=s.routes,
            )
            samples.append((sample, own, len(s.token_ids)))
        if self.on_group is not None:
            self.on_group({"group": group, "rewards": scored.rewards, "metrics": metrics})
        self.metrics_queue.put(
            {
                "rollout/staleness": float(self.model_version - version),
                "rollout/group_latency_s": float(
                    max(s.finished_at for s in usable) - group.metadata["submitted_at"]
                ),
            }
        )
        return samples


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
    routes=None,
):
    """One TRL `RolloutSample`: the loss covers the completion tokens (those of
    `completion_mask`, when a multi-turn episode interleaves the environment's), scored with the
    actor's logprobs (the prompt's are never used). Recorded `routes` go beside it
    (replay_batches.SAMPLE_ROUTES)."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    prompt_len, completion_len = len(prompt_ids), len(completion_ids)
    mask = completion_mask if completion_mask is not None else [1] * completion_len
    assert len(mask) == completion_len, "one mask entry per completion token"
    input_ids = np.array(prompt_ids + completion_ids, dtype=np.int64)
    if routes is not None:
        SAMPLE_ROUTES.attach(input_ids, routes)
    return RolloutSample(
        prompt=prompt,
        completion=completion,
        input_ids=input_ids,
        completion_mask=np.array([0] * prompt_len + list(mask), dtype=np.int64),
        old_log_probs=np.array([0.0] * prompt_len + list(logprobs), dtype=np.float32),
        advantage=advantage,
        model_version=version,
        group_id=group_id,
        metrics=dict(metrics),
        enqueued_at=time.time(),
    )
