"""RolloutPool's weight syncs: the trainer's weights, or its LoRA adapter, to every live actor
(through `pool_weights.ActorWeightSync`), each sync checked on the actors before anything moves
and run again over the survivors when actors die during it; and the plan for trainer ranks that
each sync their own actors (`rank_sync.py`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from rollout.actors.pool_weights import ActorsLostDuringSync
from rollout.actors.rank_sync import RankSyncPlan
from rollout.engine.model.loader import TORCH_DTYPES, resolve_dtype
from rollout.weight_sync.adapter_manifest import LoraAdapter, adapter_manifest_for
from rollout.weight_sync.manifest import manifest_for, manifest_from_specs


class PoolWeightSyncs:
    """RolloutPool's weight syncs (a mixin: the pool provides `engine_config`,
    `weight_bucket_bytes`, `version`, `_weights` (an ActorWeightSync), `_live`,
    `_on_live_actors` and `_on_actor_failure`)."""

    def sync_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        backend: str = "gloo",
        specs: list[tuple[str, tuple[int, ...]]] | None = None,
        device: torch.device | str | None = None,
    ) -> dict:
        """Broadcast the trainer's weights to every live actor (in place, at a step boundary).

        By default every tensor is held at once and a sync broken by an actor's death runs again
        over the survivors. With `specs` ((name, shape) in the order `named_tensors` yields
        them), the tensors are pulled one bucket at a time, just before the bucket is sent, into
        staging buffers on `device`: a trainer sharded with FSDP2 gathers each full tensor
        (`full_tensor()`) as it is pulled and never holds the whole model. Such a sync cannot run
        again, so an actor's death during it raises RuntimeError naming the actor."""
        if specs is None:
            named = [(n, t) for n, t in named_tensors]
            rollout_dtype = TORCH_DTYPES.get(self.engine_config.dtype, named[0][1].dtype)
            manifest = manifest_for(named, rollout_dtype, self.weight_bucket_bytes)
            send = functools.partial(self._weights.send, manifest=manifest, named=named)
            return self._sync("check_weights", manifest, send, version, backend, retry=True)
        if device is None:
            raise ValueError(
                "sync_weights with specs needs device=: where the trainer's full tensors are "
                "gathered (the staging buffers go there)"
            )
        device = torch.device(device)
        # No tensor to take a dtype from: "auto" resolves as an engine on the trainer's kind of
        # device would resolve it.
        rollout_dtype = resolve_dtype(self.engine_config.dtype, device)
        manifest = manifest_from_specs(specs, rollout_dtype, self.weight_bucket_bytes)
        send = functools.partial(
            self._weights.send, manifest=manifest, named=named_tensors, device=device, lazy=True
        )
        return self._sync("check_weights", manifest, send, version, backend, retry=False)

    def sync_adapter(
        self, adapter: LoraAdapter, version: int | None = None, backend: str = "gloo"
    ) -> dict:
        """Send a LoRA adapter, (module name, lora_A [r, in], lora_B [out, r], alpha / r) per
        module, to every live actor; each merges it into a snapshot of its base weights
        (rollout.actors.adapter_merge), so only the adapter's float32 factors travel. Every sync
        must name the same modules as the first."""
        manifest, factors = adapter_manifest_for(adapter, self.weight_bucket_bytes)
        send = functools.partial(self._weights.send_adapter, manifest=manifest, factors=factors)
        return self._sync("check_adapter", manifest, send, version, backend, retry=True)

    def rank_sync_plan(self, backend: str) -> RankSyncPlan:
        """The next sync for trainer ranks that each send to their own actors (rank_sync.py):
        the live actors, the version they take, how to send. Pause the pool first; once every
        rank has sent, `ranks_synced(plan)` counts the version."""
        return RankSyncPlan(
            actors=self._live(),
            version=self.version + 1,
            engine_dtype=self.engine_config.dtype,
            bucket_bytes=self.weight_bucket_bytes,
            backend=backend,
        )

    def ranks_synced(self, plan: RankSyncPlan) -> None:
        self.version = plan.version

    def _sync(
        self,
        check: str,
        manifest: Any,
        send: Callable[..., int],
        version: int | None,
        backend: str,
        retry: bool,
    ) -> dict:
        """Check `manifest` on every live actor, then `send(live=, version=, backend=)`; with
        `retry`, a sync broken by actors' deaths runs again over the survivors."""
        # Every actor checks names and shapes first; a mismatch raises before anything moves. An
        # actor found dead here is dropped (its groups move) and the others are synced.
        self._on_live_actors(check, manifest)
        start = time.perf_counter()
        new_version = version if version is not None else self.version + 1
        while True:
            live = self._live()
            if not live:
                raise RuntimeError("no live rollout actor to sync weights to")
            try:
                sent = send(live=live, version=new_version, backend=backend)
                break
            except ActorsLostDuringSync as lost:
                # Their groups move to the others. The survivors' weights may be torn (they then
                # refuse to step), so the whole sync runs again over a group of the survivors.
                for actor, err in lost.dead.items():
                    self._on_actor_failure(actor, err)
                if not retry:
                    raise RuntimeError(
                        f"{lost}; the survivors' weights may be torn (they generate nothing "
                        "until synced). A sync pulled bucket by bucket cannot run again here: "
                        "the tensors were consumed, and a sharded trainer's other ranks cannot "
                        "repeat their gathers. Sync again from the trainer on every rank"
                    ) from lost
        self.version = new_version
        return {"seconds": time.perf_counter() - start, "bytes": sent, "version": self.version}
