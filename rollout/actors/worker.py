"""RolloutWorker: one engine, driven by its own thread, fed and drained through small calls.

A plain class (tests use it directly); `rollout.actors.pool` makes it a Ray actor at spawn time. Calls
from other threads (Ray runs actor methods in a thread pool) never touch the engine: they queue
work or commands that the loop thread applies between steps, so weight updates land at a step
boundary and every request sees a consistent engine.

Its parts: `WeightReceiver` (weight_receiver.py) takes the trainer's weights and runs the parity
probe; `GroupsInFlight` (groups_in_flight.py) turns each ended sample into a FinishedSample;
multi-turn groups run as episodes (rollout.environments.episodes) whose model turns are engine
requests routed back to them.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rollout.actors.groups_in_flight import GroupsInFlight
from rollout.actors.messages import FinishedSample, GroupRequest
from rollout.actors.metrics import WorkerMetrics
from rollout.actors.weight_receiver import WeightReceiver
from rollout.engine.config import EngineConfig
from rollout.engine.llm_engine import LLMEngine
from rollout.engine.scheduling.sequence import Completion
from rollout.environments.episodes import EpisodeRunner
from rollout.weight_sync.adapter_manifest import AdapterManifest
from rollout.weight_sync.manifest import WeightManifest


class RolloutWorker:
    def __init__(self, engine_config: EngineConfig | dict, worker_id: int = 0) -> None:
        if isinstance(engine_config, dict):
            engine_config = EngineConfig.from_dict(engine_config)
        self.worker_id = worker_id
        self.engine = LLMEngine(engine_config)
        self._metrics = WorkerMetrics(self.engine)
        self.weights = WeightReceiver(self.engine, worker_id)
        """The trainer's weights in: group membership, version, torn state, parity probe."""
        self._groups = GroupsInFlight(worker_id)
        self._inbox: queue.Queue[GroupRequest] = queue.Queue()
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._outbox: list[FinishedSample] = []
        self._outbox_ready = threading.Condition()
        self._wake = threading.Event()
        self._paused = False
        self._stopping = False
        self._error: BaseException | None = None
        self._episodes: EpisodeRunner | None = None  # made for the first multi-turn group
        self._thread = threading.Thread(
            target=self._loop, name=f"rollout-worker-{worker_id}", daemon=True
        )
        self._thread.start()

    # ---- calls from the pool ---------------------------------------------------------------

    def add_groups(self, groups: list[GroupRequest]) -> int:
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
        self.weights.raise_if_torn()
        self._paused = False
        self._wake.set()

    def run_between_steps(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run `fn` on the loop thread at the next step boundary and return its result."""
        future: Future = Future()
        self._commands.put((fn, future))
        self._wake.set()
        return future.result(timeout)

    # ---- weights ---------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The weight version the engine holds."""
        return self.weights.version

    def join_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        """Join the trainer's weight-sync process group (blocks until every member joined)."""
        self.weights.join(host, port, rank, world_size, backend)

    def check_weights(self, manifest: WeightManifest) -> None:
        """Raise (naming the parameters) if a sync with this manifest would not fit the engine."""
        self.weights.check(manifest)

    def receive_weights(self, manifest: WeightManifest, version: int) -> float:
        """Receive a broadcast of new weights at a step boundary; returns seconds spent."""
        return self.run_between_steps(
            lambda: self._versioned(self.weights.receive(manifest, version))
        )

    def check_adapter(self, manifest: AdapterManifest) -> None:
        """Raise (naming the modules) if a LoRA adapter sync with this manifest would not fit."""
        self.weights.check_adapter(manifest)

    def receive_adapter(self, manifest: AdapterManifest, version: int) -> float:
        """Receive a LoRA adapter and merge it into the base weights at a step boundary;
        returns seconds spent."""
        return self.run_between_steps(
            lambda: self._versioned(self.weights.receive_adapter(manifest, version))
        )

    def _versioned(self, seconds: float) -> float:
        """After an update at a step boundary (on the loop thread): the tokens each in-flight
        sample generated so far were the old weights'; every later one is the new version's."""
        self._groups.weights_changed(self.weights.version, self.engine.output_lengths())
        return seconds

    def probe(self, prompt_token_ids: list[int], max_tokens: int = 16, seed: int = 0) -> dict:
        """Sample one completion (temperature 1) through the engine, among the running requests,
        for comparing its logprobs with the trainer's forward."""
        self.weights.raise_if_torn()
        future = self.run_between_steps(
            lambda: self.weights.add_probe(prompt_token_ids, max_tokens, seed)
        )
        completion = future.result(timeout=600)
        return {
            "token_ids": completion.token_ids,
            "logprobs": completion.logprobs,
            "routes": completion.routes,
            "version": self.version,
        }

    def metrics(self) -> dict[str, float]:
        """This worker's rollout metrics (rollout.actors.metrics.WorkerMetrics)."""
        return self._metrics.snapshot(self.version, len(self._groups) + self._inbox.qsize())

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
                if self._paused or self.weights.torn or not self.engine.has_unfinished():
                    # Idle, or only waiting for environments (their calls wake us up).
                    deadline = self._episodes.next_deadline_s() if self._episodes else None
                    self._wake.wait(0.05 if deadline is None else min(0.05, deadline + 1e-3))
                    self._wake.clear()
                    continue
                start = time.perf_counter()
                completions = self.engine.step()
                self._metrics.record_step(time.perf_counter() - start)
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
            request_id = self._groups.add(group, self.version)
            if group.environment is None:
                self.engine.add_request(group.prompt_token_ids, group.params, request_id=request_id)
                continue
            if self._episodes is None:
                self._episodes = EpisodeRunner(self.engine, wake=self._wake.set)
            self._episodes.start(
                request_id, group.environment, group.row or {}, group.params, group.limits
            )

    def _deliver(self, completions: list[Completion]) -> None:
        """Route the step's completions: a probe's to its caller, a model turn to its episode,
        a plain sample to the pool."""
        ended = []
        for c in completions:
            if self.weights.claim(c):
                continue
            if self._episodes is not None and self._episodes.owns(c.request_id):
                self._episodes.on_completion(c)  # a model turn: its episode goes on
                continue
            ended.append((c.request_id, c))
        self._publish(ended)

    def _deliver_episodes(self) -> None:
        if self._episodes is None or not self._episodes.finished:
            return
        episodes, self._episodes.finished = self._episodes.finished, []
        self._publish([(e.group_key, e) for e in episodes])

    def _publish(self, ended: list) -> None:
        """(request id, Completion or Episode) pairs -> FinishedSamples for the pool's poll."""
        if not ended:
            return
        now = time.time()
        samples = []
        for request_id, sample in ended:
            samples.append(self._groups.finished(request_id, sample, self.version, now))
            self._metrics.record_finished(samples[-1])
        with self._outbox_ready:
            self._outbox.extend(samples)
            self._outbox_ready.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"rollout worker {self.worker_id} failed: {self._error!r}"
            ) from self._error
