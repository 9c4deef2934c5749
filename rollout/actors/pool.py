"""RolloutPool: spreads groups over Ray rollout actors and streams their samples back.

Each actor is a `RolloutWorker` made a Ray actor at spawn time. A collector thread keeps one
`poll()` call in flight per actor and routes finished samples to their groups; a group is handed
out (`get()`) once all of its G samples are in, exactly once. New groups go to the actor with the
least outstanding work (estimated tokens). When an actor dies, its unfinished groups are generated
again, whole, on the others (a new attempt number makes any stray late sample harmless).
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.actors.messages import ActorDeath, CompletedGroup, FinishedSample, GroupRequest
from rollout.actors.pool_syncs import PoolWeightSyncs
from rollout.actors.pool_weights import ActorWeightSync
from rollout.actors.worker import RolloutWorker
from rollout.engine.config import EngineConfig
from rollout.engine.sampling_params import SamplingParams
from rollout.environments.base import EpisodeLimits
from rollout.weight_sync.manifest import DEFAULT_BUCKET_BYTES


@dataclass
class _Group:
    request: GroupRequest
    actor: int
    submitted_at: float
    metadata: dict
    samples: dict[int, FinishedSample] = field(default_factory=dict)

    @property
    def cost(self) -> int:  # tokens this group may still generate or hold
        return self.request.params.n * (
            len(self.request.prompt_token_ids) + self.request.params.max_tokens
        )


class RolloutPool(PoolWeightSyncs):
    def __init__(
        self,
        engine_config: EngineConfig,
        num_actors: int,
        *,
        num_gpus_per_actor: float = 0.0,
        num_cpus_per_actor: float = 1.0,
        poll_timeout_s: float = 0.2,
        start_timeout_s: float = 1800.0,
        actor_options: Callable[[int], dict] | None = None,
        weight_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        """`actor_options(i)`: more Ray options for actor i (e.g. its placement-group seat)."""
        import ray

        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1; got {num_actors}")
        if not ray.is_initialized():
            raise RuntimeError("call ray.init() before creating a RolloutPool")
        self._ray = ray
        self.engine_config = engine_config
        self.poll_timeout_s = poll_timeout_s
        self.weight_bucket_bytes = weight_bucket_bytes
        """The most bytes one transfer of a weight sync carries (a larger tensor goes alone)."""
        actor_class = ray.remote(RolloutWorker)
        self.actors: dict[int, Any] = {}
        for i in range(num_actors):
            self.actors[i] = actor_class.options(
                num_gpus=num_gpus_per_actor,
                num_cpus=num_cpus_per_actor,
                max_concurrency=8,  # poll blocks in one thread while submit/stats run in others
                **(actor_options(i) if actor_options is not None else {}),
            ).remote(engine_config.__dict__, i)
        try:  # engines loaded (a model from disk can take minutes; never wait forever)
            ray.get([a.ping.remote() for a in self.actors.values()], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            for a in self.actors.values():
                ray.kill(a, no_restart=True)
            raise RuntimeError(
                f"{num_actors} rollout actor(s) were not up after {start_timeout_s:.0f} s "
                f"(each asks for {num_gpus_per_actor} GPU, {num_cpus_per_actor} CPU; Ray has "
                f"{ray.available_resources()} free). Check the cluster's resources, or raise "
                "start_timeout_s for a large model"
            ) from err
        self.dead: dict[int, str] = {}
        self.deaths: list[ActorDeath] = []
        self.on_actor_death: Callable[[ActorDeath], None] | None = None
        """Called (from the thread that noticed it) with each actor the pool loses."""
        self.version = 0
        self._groups: dict[int, _Group] = {}
        self._load = dict.fromkeys(self.actors, 0)
        self._done: queue.Queue[CompletedGroup | BaseException] = queue.Queue()
        self._lock = threading.Lock()
        self._group_ids = itertools.count()
        self._stopping = False
        self._weights = ActorWeightSync(ray)
        self._collector = threading.Thread(target=self._collect, name="rollout-pool", daemon=True)
        self._collector.start()

    # ---- groups ------------------------------------------------------------------------------

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        metadata: dict | None = None,
        environment: str | None = None,
        row: dict | None = None,
        limits: EpisodeLimits | None = None,
    ) -> int:
        """Queue one prompt's `params.n` samples on the least-loaded live actor; returns its id.
        With `environment`, params.n multi-turn episodes of it on dataset row `row` instead
        (the environment's reset gives the prompt; prompt_token_ids is unused)."""
        with self._lock:
            group_id = next(self._group_ids)
            request = GroupRequest(
                group_id,
                list(prompt_token_ids),
                params,
                environment=environment,
                row=row,
                limits=limits if limits is not None or environment is None else EpisodeLimits(),
            )
            group = _Group(request, -1, time.time(), metadata or {})
            self._groups[group_id] = group
            self._dispatch(group)
        return group_id

    def get(self, timeout: float | None = None) -> CompletedGroup:
        """The next completed group (in completion order); raises queue.Empty on timeout."""
        item = self._done.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def abort(self, group_ids: list[int]) -> None:
        """End these groups early; they are still delivered, with finish_reason "abort".

        A group whose actor turns out to be dead has moved to another actor by the time that is
        known: the abort follows it there. (A group whose new attempt starts after the abort
        reaches that actor runs to the end instead; it is still delivered once.)"""
        pending = set(group_ids)
        while pending:
            by_actor: dict[int, list[int]] = {}
            with self._lock:
                for g in pending:
                    if g in self._groups and self._groups[g].actor not in self.dead:
                        by_actor.setdefault(self._groups[g].actor, []).append(g)
            refs = {a: self.actors[a].abort.remote(ids) for a, ids in by_actor.items()}
            pending = set()
            for a, ref in refs.items():
                try:
                    self._ray.get(ref)
                except self._ray.exceptions.RayActorError as err:
                    self._on_actor_failure(a, err)
                    pending.update(by_actor[a])

    def pause(self) -> None:
        self._on_live_actors("pause")

    def resume(self) -> None:
        self._on_live_actors("resume")

    def actor_metrics(self) -> dict[int, dict[str, float]]:
        """Per live actor metrics (see rollout.actors.metrics.WorkerMetrics)."""
        return self._on_live_actors("metrics")

    def kill_actor(self, actor: int) -> None:
        """Kill one actor (fault-injection for tests and drills); its groups move elsewhere."""
        self._ray.kill(self.actors[actor], no_restart=True)

    def shutdown(self) -> None:
        self._stopping = True
        self._collector.join(timeout=10)
        for a in self._live().values():
            self._ray.kill(a, no_restart=True)

    def live_actors(self) -> list[int]:
        """The ids of the actors the pool has not lost."""
        return list(self._live())

    def probe(
        self, prompt_token_ids: list[int], max_tokens: int = 16, actor: int | None = None
    ) -> dict:
        """One sampled completion with logprobs from an actor (for the logprob parity check)."""
        live = self._live()
        handle = live[actor] if actor is not None else next(iter(live.values()))
        return self._ray.get(handle.probe.remote(prompt_token_ids, max_tokens))

    # ---- internals ---------------------------------------------------------------------------

    def _live(self) -> dict[int, Any]:
        return {i: a for i, a in self.actors.items() if i not in self.dead}

    def _on_live_actors(self, method: str, *args) -> dict[int, Any]:
        """Call `method` on every live actor; returns {actor: result} from those that answered.

        An actor that turns out to be dead is handled as if the collector had seen it die (its
        groups go to the others), so a call between steps never fails on a death the pool had
        not noticed yet. Any other error is raised, after every call has finished."""
        refs = {i: getattr(a, method).remote(*args) for i, a in self._live().items()}
        results, error = {}, None
        for i, ref in refs.items():
            try:
                results[i] = self._ray.get(ref)
            except self._ray.exceptions.RayActorError as err:
                self._on_actor_failure(i, err)
            except Exception as err:  # noqa: BLE001 - raised below, once all have answered
                error = error or err
        if error is not None:
            raise error
        if not results and not self._live():
            raise RuntimeError(f"no rollout actor is alive: {self.dead}")
        return results

    def _dispatch(self, group: _Group) -> None:
        """Send to the live actor with the least outstanding tokens (caller holds the lock)."""
        live = [i for i in self.actors if i not in self.dead]
        if not live:
            raise RuntimeError("no rollout actor is alive")
        actor = min(live, key=lambda i: self._load[i])
        group.actor = actor
        self._load[actor] += group.cost
        self.actors[actor].add_groups.remote([group.request])

    def _collect(self) -> None:
        ray = self._ray
        polls: dict[Any, int] = {}
        while not self._stopping:
            for i, actor in self._live().items():
                if i not in polls.values():
                    polls[actor.poll.remote(self.poll_timeout_s)] = i
            if not polls:
                time.sleep(0.1)
                continue
            ready, _ = ray.wait(list(polls), num_returns=1, timeout=1.0)
            for ref in ready:
                actor = polls.pop(ref)
                try:
                    samples = ray.get(ref)
                except ray.exceptions.RayError as err:
                    self._on_actor_failure(actor, err)
                    polls = {r: a for r, a in polls.items() if a != actor}
                    continue
                self._accept(samples)

    def _accept(self, samples: list[FinishedSample]) -> None:
        with self._lock:
            for sample in samples:
                group = self._groups.get(sample.group_id)
                if group is None or group.request.attempt != sample.attempt:
                    continue  # from a superseded attempt
                group.samples[sample.sample_index] = sample
                if len(group.samples) == group.request.params.n:
                    del self._groups[sample.group_id]
                    self._load[group.actor] -= group.cost
                    ordered = [group.samples[i] for i in sorted(group.samples)]
                    metadata = dict(group.metadata, submitted_at=group.submitted_at)
                    self._done.put(CompletedGroup(sample.group_id, ordered, metadata))

    def _on_actor_failure(self, actor: int, err: BaseException) -> None:
        with self._lock:
            if actor in self.dead:  # seen by both the collector and a call between steps
                return
            self.dead[actor] = repr(err)
            death = ActorDeath(actor, time.time(), repr(err), len(self.actors) - len(self.dead))
            self.deaths.append(death)
            orphans = [g for g in self._groups.values() if g.actor == actor]
            try:
                self._ray.kill(self.actors[actor], no_restart=True)
            except Exception:  # noqa: BLE001 - it may be gone already
                pass
            if len(self.dead) == len(self.actors):
                self._done.put(RuntimeError(f"all rollout actors died; last error: {err!r}"))
            else:
                for group in orphans:
                    self._load[actor] -= group.cost
                    group.request = dataclasses.replace(
                        group.request, attempt=group.request.attempt + 1
                    )
                    group.samples.clear()
                    self._dispatch(group)
        if self.on_actor_death is not None:
            self.on_actor_death(death)
