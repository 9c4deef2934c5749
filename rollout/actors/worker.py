"""RolloutWorker: one engine, driven by its own thread, fed and drained through small calls.

A plain class (tests use it directly); `rollout.actors.pool` makes it a Ray actor at spawn time. Calls
from other threads (Ray runs actor methods in a thread pool) never touch the engine: they queue
work or commands that the loop thread applies between steps, so weight updates land at a step
boundary and every request sees a consistent engine.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from rollout.actors.messages import FinishedSample, GroupRequest
from rollout.actors.metrics import WorkerMetrics
from rollout.engine.config import EngineConfig
from rollout.engine.llm_engine import LLMEngine
from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.sequence import Completion
from rollout.environments.episodes import EpisodeRunner
from rollout.weight_sync import (
    TornWeightsError,
    WeightGroup,
    WeightManifest,
    check_manifest,
    receive_weights,
)


class RolloutWorker:
    def __init__(self, engine_config: EngineConfig | dict, worker_id: int = 0) -> None:
        if isinstance(engine_config, dict):
            engine_config = EngineConfig.from_dict(engine_config)
        self.worker_id = worker_id
        self.engine = LLMEngine(engine_config)
        self.version = 0
        self.metrics = WorkerMetrics(self.engine)
        self._inbox: queue.Queue[GroupRequest] = queue.Queue()
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._outbox: list[FinishedSample] = []
        self._outbox_ready = threading.Condition()
        self._wake = threading.Event()
        self._paused = False
        self._torn_weights = False
        """A weight sync failed part-way: some parameters are new, some old. No step runs (and no
        sample is made with such weights) until a sync succeeds."""
        self._stopping = False
        # request id -> (group, wall time received, weight version at start, samples not yet back)
        self._groups: dict[str, tuple[GroupRequest, float, int]] = {}
        self._remaining: dict[str, int] = {}
        self._error: BaseException | None = None
        self._probes: dict[str, Future] = {}
        self._weight_group: WeightGroup | None = None
        self._episodes: EpisodeRunner | None = None  # made for the first multi-turn group
        self._thread = threading.Thread(
            target=self._loop, name=f"rollout-worker-{worker_id}", daemon=True
        )
        self._thread.start()

    # ---- calls from the pool ---------------------------------------------------------------

    def submit(self, groups: list[GroupRequest]) -> int:
        """Queue groups; returns how many are now queued or running here."""
        for group in groups:
            self._inbox.put(group)
        self._wake.set()
        return len(self._groups) + self._inbox.qsize()

    def poll(self, timeout: float = 1.0) -> list[FinishedSample]:
        """Finished samples since the last poll; waits up to `timeout` for the first one."""
        self._raise_if_failed()
        with self._outbox_ready:
            if not self._outbox:
                self._outbox_ready.wait(timeout)
            samples, self._outbox = self._outbox, []
        return samples

    def abort(self, group_ids: list[int]) -> None:
        """End these groups (their samples come back with finish_reason "abort")."""

        def abort_all() -> None:
            for g in group_ids:
                self.engine.abort(str(g))
                if self._episodes is not None:
                    self._episodes.abort(str(g))
            self._deliver_episodes()

        self.run_between_steps(abort_all)

    def pause(self) -> None:
        """Stop stepping (after the current step); queued and running requests stay."""
        self.run_between_steps(lambda: setattr(self, "_paused", True))

    def resume(self) -> None:
        self._raise_if_torn()
        self._paused = False
        self._wake.set()

    def run_between_steps(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run `fn` on the loop thread at the next step boundary and return its result."""
        future: Future = Future()
        self._commands.put((fn, future))
        self._wake.set()
        return future.result(timeout)

    # ---- weights ---------------------------------------------------------------------------

    def join_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        """Join the trainer's weight-sync process group (blocks until every member joined)."""
        if backend in ("nccl", "cuda_ipc"):
            device = self.engine.device
            if device.type != "cuda":
                raise ValueError(
                    f"weight sync over {backend} needs the engine on a GPU; it is on {device}. "
                    "Use gloo"
                )
            # The engine's device may carry no index ("cuda"), which set_device refuses.
            torch.cuda.set_device(
                device.index if device.index is not None else torch.cuda.current_device()
            )
        self._weight_group = WeightGroup(host, port, rank, world_size, backend)

    def check_weights(self, manifest: WeightManifest) -> None:
        """Raise (naming the parameters) if a sync with this manifest would not fit the engine."""
        check_manifest(self.engine.model, manifest)

    def receive_weights(self, manifest: WeightManifest, version: int) -> float:
        """Receive a broadcast of new weights at a step boundary; returns seconds spent."""
        if self._weight_group is None:
            raise RuntimeError("join_weight_group() first")

        def apply() -> float:
            start = time.perf_counter()
            try:
                self.engine.update_weights(
                    lambda model: receive_weights(self._weight_group, manifest, model)
                )
            except BaseException as err:
                # Torn by this transfer, or still torn by an earlier one.
                self._torn_weights = self._torn_weights or isinstance(err, TornWeightsError)
                # Leave the group: a trainer still sending to this rank then fails at once
                # instead of waiting out the group's timeout (the pool builds a new group).
                self._weight_group.close()
                self._weight_group = None
                raise
            self._torn_weights = False
            self.version = version
            return time.perf_counter() - start

        return self.run_between_steps(apply)

    def probe(self, prompt_token_ids: list[int], max_tokens: int = 16, seed: int = 0) -> dict:
        """Sample one completion (temperature 1) through the engine, among the running requests,
        for comparing its logprobs with the trainer's forward."""
        self._raise_if_torn()
        future: Future = Future()
        request_id = f"probe-{len(self._probes)}-{time.monotonic_ns()}"
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)

        def add() -> None:
            self._probes[request_id] = future
            self.engine.add_request(prompt_token_ids, params, request_id=request_id)

        self.run_between_steps(add)
        completion = future.result(timeout=600)
        return {
            "token_ids": completion.token_ids,
            "logprobs": completion.logprobs,
            "version": self.version,
        }

    def stats(self) -> dict[str, float]:
        return self.metrics.snapshot(self.version, len(self._groups) + self._inbox.qsize())

    def ping(self) -> int:
        return self.worker_id

    def gpu_ids(self) -> list[str]:
        """The physical GPUs this process sees (Ray sets CUDA_VISIBLE_DEVICES for GPU actors)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [d for d in visible.split(",") if d]

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        if self._episodes is not None:
            self._episodes.shutdown()

    # ---- the loop thread -------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                self._admit()
                if self._episodes is not None:
                    self._episodes.poll()  # environment calls back: next turns, ended episodes
                    self._deliver_episodes()
                if self._paused or self._torn_weights or not self.engine.has_unfinished():
                    # Idle, or only waiting for environments (their calls wake us up).
                    deadline = self._episodes.next_deadline_s() if self._episodes else None
                    self._wake.wait(0.05 if deadline is None else min(0.05, deadline + 1e-3))
                    self._wake.clear()
                    continue
                start = time.perf_counter()
                completions = self.engine.step()
                self.metrics.record_step(time.perf_counter() - start)
                self._deliver(completions)
        except BaseException as err:  # noqa: BLE001 - surfaced to the pool by the next poll
            self._error = err
            with self._outbox_ready:
                self._outbox_ready.notify_all()

    def _apply_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - the caller gets it from the future
                future.set_exception(err)

    def _admit(self) -> None:
        while True:
            try:
                group = self._inbox.get_nowait()
            except queue.Empty:
                return
            request_id = str(group.group_id)
            self._groups[request_id] = (group, time.time(), self.version)
            self._remaining[request_id] = group.params.n
            if group.environment is None:
                self.engine.add_request(group.prompt_token_ids, group.params, request_id=request_id)
                continue
            if self._episodes is None:
                self._episodes = EpisodeRunner(self.engine, wake=self._wake.set)
            self._episodes.start(
                request_id, group.environment, group.row or {}, group.params, group.limits
            )

    def _deliver(self, completions: list[Completion]) -> None:
        if not completions:
            return
        now = time.time()
        samples = []
        for c in completions:
            if c.request_id in self._probes:
                self._probes.pop(c.request_id).set_result(c)
                continue
            if self._episodes is not None and self._episodes.owns(c.request_id):
                self._episodes.on_completion(c)  # a model turn: its episode goes on
                continue
            samples.append(
                self._sample(c.request_id, now, sample_index=c.index,
                             prompt_token_ids=c.prompt_token_ids, token_ids=c.token_ids,
                             logprobs=c.logprobs, finish_reason=c.finish_reason, error=c.error,
                             queue_wait_s=c.queue_wait_s)
            )  # fmt: skip
        self._publish(samples)

    def _sample(self, request_id: str, now: float, **fields) -> FinishedSample:
        """The FinishedSample of one of the group's samples; the group is done with its last."""
        group, received, version = self._groups[request_id]
        sample = FinishedSample(
            group_id=group.group_id,
            attempt=group.attempt,
            weight_versions=(version, self.version),
            actor=self.worker_id,
            received_at=received,
            finished_at=now,
            **fields,
        )
        self.metrics.record_finished(sample)
        self._remaining[request_id] -= 1
        if self._remaining[request_id] == 0:
            del self._remaining[request_id], self._groups[request_id]
        return sample

    def _deliver_episodes(self) -> None:
        if self._episodes is None or not self._episodes.finished:
            return
        episodes, self._episodes.finished = self._episodes.finished, []
        now = time.time()
        self._publish([
            self._sample(e.group_key, now, sample_index=e.index, prompt_token_ids=e.prompt_ids,
                         token_ids=e.token_ids, logprobs=e.logprobs,
                         finish_reason=e.finish_reason, error=e.error,
                         queue_wait_s=e.queue_wait_s, completion_mask=e.mask, reward=e.reward,
                         episode_status=e.status, num_turns=e.turns)
            for e in episodes
        ])  # fmt: skip

    def _publish(self, samples: list[FinishedSample]) -> None:
        if not samples:
            return
        with self._outbox_ready:
            self._outbox.extend(samples)
            self._outbox_ready.notify_all()

    def _raise_if_torn(self) -> None:
        if self._torn_weights:
            raise RuntimeError(
                f"rollout worker {self.worker_id}: the last weight sync failed part-way, so the "
                "engine holds a mix of two weight versions; sync the weights again first"
            )

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"rollout worker {self.worker_id} failed: {self._error!r}"
            ) from self._error
