"""Everything that touches TRL lives here (tested with trl==1.16.0, pinned in pyproject.toml).

- streaming (default): `trl.experimental.async_grpo.AsyncGRPOTrainer` with our rollout worker
  (prompts -> groups on the RolloutPool -> rewards + advantages -> `RolloutSample`s) and our
  weight transfer (the pool's broadcast);
- synchronous fallback: `trl.GRPOTrainer(rollout_func=...)` backed by the same pool, with a weight
  sync before each generation.
Three things make AsyncGRPOTrainer run offline and on CPU: its peak-FLOPs probe (CUDA only, feeds
an MFU metric) is neutralised on CPU; its training attention ("tree_fa3", a Hub kernel) is
replaced after construction by `trainers.tree_attention`; `token_budget` is always set.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rollout.engine.sampling_params import SamplingParams
from trainers.prompts import PromptFormatter
from trainers.scoring import score_group
from trainers.tree_attention import TREE_ATTENTION_NAME, register_tree_attention

TRL_VERSION = "1.16.0"


class PoolRolloutWorker:
    """AsyncGRPOTrainer's rollout worker, backed by a RolloutPool.

    Keeps at most `max_inflight_groups` groups generating (on demand, so samples stay fresh),
    scores each completed group and pushes one RolloutSample per sample into `rollout_buffer`.
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
    ) -> None:
        self.pool = pool
        self.dataset = dataset
        self.formatter = formatter
        self.reward_funcs = reward_funcs
        self.sampling = sampling
        self.max_inflight_groups = max_inflight_groups
        self.on_group = on_group
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self.cursor = 0  # next dataset row (our own resume state)
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
                ):
                    row = self.dataset[self.cursor % len(self.dataset)]
                    self.cursor += 1
                    group_id = self.pool.submit(
                        self.formatter.prompt_ids(row["prompt"]), self.sampling
                    )
                    rows[group_id] = row
                try:
                    group = self.pool.get(timeout=0.2)
                except queue.Empty:
                    continue
                row = rows.pop(group.group_id)
                for sample in self._samples(group, row):
                    self.rollout_buffer.put(sample)
                self._last_progress = time.time()
        except BaseException as err:  # noqa: BLE001 - surfaced by check_health
            self._error = err

    def _samples(self, group, row: dict) -> list:
        completions = [self.formatter.completion(s.token_ids, row["prompt"]) for s in group.samples]
        columns = {k: [v] * len(completions) for k, v in row.items() if k != "prompt"}
        scored = score_group(
            [row["prompt"]] * len(completions),
            completions,
            [s.token_ids for s in group.samples],
            columns,
            self.reward_funcs,
        )
        version = group.weight_versions[0]
        metrics = {
            "reward": float(scored.rewards.mean()),
            "reward_std": float(scored.rewards.std()),
        }
        for name, values in scored.per_function.items():
            metrics[f"rewards/{name}"] = float(np.nanmean(values))
        samples = [
            rollout_sample(
                row["prompt"],
                completion,
                s.prompt_token_ids,
                s.token_ids,
                s.logprobs,
                float(advantage),
                version,
                group.group_id,
                metrics,
            )
            for s, completion, advantage in zip(
                group.samples, completions, scored.advantages, strict=True
            )
        ]
        if self.on_group is not None:
            self.on_group({"group": group, "rewards": scored.rewards, "metrics": metrics})
        self.metrics_queue.put(
            {
                "rollout/staleness": float(self.model_version - version),
                "rollout/group_latency_s": float(
                    max(s.finished_at for s in group.samples) - group.metadata["submitted_at"]
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
):
    """One TRL `RolloutSample`: the loss covers the completion tokens, scored with the actor's
    logprobs (the prompt's are never used)."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    prompt_len, completion_len = len(prompt_ids), len(completion_ids)
    return RolloutSample(
        prompt=prompt,
        completion=completion,
        input_ids=np.array(prompt_ids + completion_ids, dtype=np.int64),
        completion_mask=np.array([0] * prompt_len + [1] * completion_len, dtype=np.int64),
        old_log_probs=np.array([0.0] * prompt_len + list(logprobs), dtype=np.float32),
        advantage=advantage,
        model_version=version,
        group_id=group_id,
        metrics=dict(metrics),
        enqueued_at=time.time(),
    )


class PoolWeightTransfer:
    """AsyncGRPOTrainer's weight transfer: the pool's broadcast, then a logprob parity probe."""

    def __init__(
        self, pool, parity_check: Callable[[], float] | None = None, backend: str = "gloo"
    ) -> None:
        self.pool = pool
        self.parity_check = parity_check
        self.backend = backend
        self.history: list[dict] = []

    def init_weight_transfer(self) -> None:
        pass  # the pool builds its group on the first sync

    def pause(self) -> None:
        self.pool.pause()

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        result = self.pool.sync_weights(iterator, backend=self.backend)
        self.history.append(result)

    def resume(self) -> None:
        self.pool.resume()
        if self.parity_check is not None and self.history:
            self.history[-1]["logprob_max_abs_diff"] = self.parity_check()

    def destroy(self) -> None:
        pass


def build_async_trainer(
    model_path: str,
    tokenizer,
    dataset,
    reward_funcs: list[Callable],
    worker: PoolRolloutWorker,
    transfer: PoolWeightTransfer,
    args: dict,
):
    """AsyncGRPOTrainer wired to our worker and transfer, its attention swapped for ours."""
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


def make_rollout_func(
    pool,
    formatter: PromptFormatter,
    sampling: SamplingParams,
    sync: Callable[[Any], None],
):
    """`rollout_func` for trl.GRPOTrainer: prompts arrive repeated num_generations times in a row;
    each run of equal prompts becomes one group on the pool; one completion per received prompt."""

    def rollout_func(prompts: list, trainer) -> dict[str, list]:
        sync(trainer)  # the pool generates with the trainer's current weights
        num_generations = trainer.args.num_generations
        groups = []
        for start in range(0, len(prompts), num_generations):
            prompt = prompts[start]
            params = dataclasses.replace(sampling, n=num_generations)
            groups.append(pool.submit(formatter.prompt_ids(prompt), params))
        done = {}
        while len(done) < len(groups):
            group = pool.get(timeout=3600)
            done[group.group_id] = group
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for group_id in groups:
            for sample in done[group_id].samples:
                out["prompt_ids"].append(sample.prompt_token_ids)
                out["completion_ids"].append(sample.token_ids)
                out["logprobs"].append(sample.logprobs)
        return out

    return rollout_func


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
    warns); the GPU machine's 5.17 knows only the old one. Use the name this version has."""
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
