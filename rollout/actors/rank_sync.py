"""A trainer rank's own weight sync to the rollout actors beside it.

With several trainer ranks colocated with actors (each rank's GPU also holds an actor), CUDA IPC
reaches only the actor on the sender's own GPU: every rank sends what it gathered to its own
actor. The pool (on the first rank) still pauses and resumes every actor and counts the weight
versions; before each sync it hands every rank a `RankSyncPlan` (`RolloutPool.rank_sync_plan`),
and a rank's `RankWeightSender` checks and moves tensors to the actors the plan gives it, from
any process of the Ray cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rollout.actors.pool_weights import ActorsLostDuringSync, ActorWeightSync
from rollout.engine.model.loader import resolve_dtype
from rollout.weight_sync.adapter_manifest import LoraAdapter, adapter_manifest_for
from rollout.weight_sync.manifest import manifest_from_specs


@dataclass(frozen=True)
class RankSyncPlan:
    """One sync as the pool plans it for the ranks (picklable: it is broadcast to them)."""

    actors: dict[int, Any]
    """Live actor id -> its Ray handle; a dead actor is left out (its rank sends nothing)."""
    version: int
    """The weight version every actor takes with this sync."""
    engine_dtype: str
    bucket_bytes: int
    backend: str


class RankWeightSender:
    """Sends one trainer rank's weights (or LoRA adapter) to its own actors. Keep one per rank:
    its weight-sync group is built on the first sync and kept while the actors and backend
    stay the same."""

    def __init__(self) -> None:
        import ray

        self._ray = ray
        self._sync = ActorWeightSync(ray)

    def send_weights(
        self,
        plan: RankSyncPlan,
        actors: list[int],
        named: Iterable[tuple[str, torch.Tensor]],
        specs: list[tuple[str, tuple[int, ...]]],
        device: torch.device,
    ) -> dict:
        """Pull `named` ((name, full tensor) in the order of `specs`) bucket by bucket into
        staging buffers on `device` and send each to `actors`."""
        dtype = resolve_dtype(plan.engine_dtype, torch.device(device))
        manifest = manifest_from_specs(specs, dtype, plan.bucket_bytes)
        return self._run(
            plan,
            actors,
            lambda handle: handle.check_weights.remote(manifest),
            lambda live: self._sync.send(
                live, manifest, named, plan.version, plan.backend, torch.device(device), lazy=True
            ),
        )

    def send_adapter(self, plan: RankSyncPlan, actors: list[int], adapter: LoraAdapter) -> dict:
        manifest, factors = adapter_manifest_for(adapter, plan.bucket_bytes)
        return self._run(
            plan,
            actors,
            lambda handle: handle.check_adapter.remote(manifest),
            lambda live: self._sync.send_adapter(
                live, manifest, factors, plan.version, plan.backend
            ),
        )

    def _run(self, plan: RankSyncPlan, actors: list[int], check, send) -> dict:
        live = {i: plan.actors[i] for i in actors}
        start = time.perf_counter()
        try:
            # Names and shapes first: a mismatch raises before anything moves.
            self._ray.get([check(handle) for handle in live.values()])
            sent = send(live)
        except ActorsLostDuringSync as lost:
            raise RuntimeError(
                f"{lost}; its trainer rank cannot send its weights elsewhere (each actor is "
                "reached only from the rank beside it)"
            ) from lost
        except self._ray.exceptions.RayActorError as err:
            raise RuntimeError(
                f"rollout actor(s) {sorted(live)} died before the weight sync: {err}"
            ) from err
        return {"seconds": time.perf_counter() - start, "bytes": sent, "version": plan.version}
