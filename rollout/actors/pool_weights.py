"""The pool's side of a weight sync: one process group of the trainer (rank 0) and every live
actor, built on the first sync and again whenever the members or the backend change.

This is where a sync meets Ray (the actors' join and receive calls, their deaths);
`rollout.weight_sync` below it only moves tensors over a process group."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import torch

from rollout.weight_sync.adapter_manifest import AdapterManifest
from rollout.weight_sync.group import WeightGroup, free_port
from rollout.weight_sync.manifest import WeightManifest
from rollout.weight_sync.transfer import send_weights


class ActorsLostDuringSync(RuntimeError):
    """Actors died while a sync was under way; the group is gone, the others' weights may be torn."""

    def __init__(self, dead: dict[int, BaseException]) -> None:
        super().__init__(f"rollout actor(s) {sorted(dead)} died during the weight sync")
        self.dead = dead


class _ReceiverEnded(RuntimeError):
    """An actor's receive call ended before the trainer sent the last bucket: it died or failed,
    so the rest is not sent (and, for a lazy sync, not gathered)."""


class ActorWeightSync:
    def __init__(self, ray) -> None:
        self._ray = ray
        self._group: WeightGroup | None = None
        self._members: tuple = ()
        """(live actor ids, backend) of the current group."""

    def send(
        self,
        live: dict[int, Any],
        manifest: WeightManifest,
        named: Iterable[tuple[str, torch.Tensor]],
        version: int,
        backend: str,
        device: torch.device | None = None,
        lazy: bool = False,
    ) -> int:
        """Send the trainer's tensors to every actor in `live` (they copy them in at a step
        boundary and take `version`); returns bytes sent. `lazy`: `named` is an iterator
        consumed bucket by bucket (see transfer.send_weights), its staging buffers on `device`."""
        if device is None:
            device = named[0][1].device
        return self._run(
            live,
            backend,
            receive=lambda actor: actor.receive_weights.remote(manifest, version),
            transmit=lambda group, check: send_weights(
                group, manifest, named, device, lazy=lazy, before_bucket=check
            ),
        )

    def send_adapter(
        self,
        live: dict[int, Any],
        manifest: AdapterManifest,
        factors: list[tuple[str, torch.Tensor]],
        version: int,
        backend: str,
    ) -> int:
        """Send a LoRA adapter's factors to every actor in `live` (each merges them into its
        base weights at a step boundary and takes `version`); returns bytes sent."""
        device = factors[0][1].device
        return self._run(
            live,
            backend,
            receive=lambda actor: actor.receive_adapter.remote(manifest, version),
            transmit=lambda group, check: send_weights(
                group, manifest.factors, factors, device, before_bucket=check
            ),
        )

    def _run(
        self,
        live: dict[int, Any],
        backend: str,
        receive: Callable[[Any], Any],
        transmit: Callable[[WeightGroup, Callable[[], None]], int],
    ) -> int:
        """Start every actor's `receive`, then `transmit` as rank 0 of their group, checking
        before each bucket that no receive has ended (an ended one died or failed: the rest is
        not sent); raises ActorsLostDuringSync if any actor died, else the first error on
        either side."""
        if self._members != (tuple(live), backend):
            self._group = self._join(live, backend)
            self._members = (tuple(live), backend)
        receives = {i: receive(a) for i, a in live.items()}
        refs = list(receives.values())

        def check_receivers() -> None:
            ended, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
            if ended:
                raise _ReceiverEnded("an actor's receive ended before the last bucket was sent")

        sent, failure = 0, None
        try:
            sent = transmit(self._group, check_receivers)
        except Exception as err:  # noqa: BLE001 - raised below, once every actor has answered
            failure = err
            self._drop_group()  # members still waiting on this rank fail now, not at the timeout
        dead, errors = {}, []
        for i, ref in receives.items():
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayActorError as err:
                dead[i] = err
            except Exception as err:  # noqa: BLE001 - an actor's own error, raised below
                errors.append(getattr(err, "cause", None) or err)
        if dead or failure is not None or errors:
            self._drop_group()  # the next sync builds a fresh one
        if dead:
            raise ActorsLostDuringSync(dead) from failure
        ended_early = isinstance(failure, _ReceiverEnded) or isinstance(
            getattr(failure, "__cause__", None), _ReceiverEnded
        )  # (a transport may wrap it)
        if failure is not None and not ended_early:
            raise failure
        if errors:
            raise RuntimeError(
                f"a rollout actor failed to receive the weights: {errors[0]}"
            ) from failure
        if failure is not None:
            raise failure
        return sent

    def _drop_group(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group, self._members = None, ()

    def _join(self, live: dict, backend: str) -> WeightGroup:
        """Build the trainer + actors group. Rank 0's side waits for every member to connect,
        so it runs on a helper thread while this one watches the actors' joins: an actor that
        fails to join raises here at once instead of leaving rank 0 waiting out its timeout."""
        # This node's address, which actors on other nodes of a cluster can reach too.
        host, port = self._ray.util.get_node_ip_address(), free_port()
        world = len(live) + 1
        joins = [
            a.join_weight_group.remote(host, port, rank + 1, world, backend)
            for rank, a in enumerate(live.values())
        ]
        group: Future = Future()

        def build() -> None:
            try:
                group.set_result(WeightGroup(host, port, 0, world, backend))
            except BaseException as e:
                group.set_exception(e)

        # A daemon thread: after a failed join it waits out its timeout without holding up exit.
        threading.Thread(target=build, name="weight-group", daemon=True).start()
        # Joins in the order they end: an actor that died since the pool last looked (a kill
        # lands some time after it is asked for) ends its join at once, while the others wait
        # for it. It is reported as lost, so the sync runs again over the survivors; their
        # joins here wait out the timeout in threads of their own (an actor takes several
        # calls at once) beside the next group's.
        pending = dict(zip(joins, live, strict=True))
        while pending:
            ready, _ = self._ray.wait(list(pending), num_returns=1)
            actor = pending.pop(ready[0])
            try:
                self._ray.get(ready[0])
            except self._ray.exceptions.RayActorError as e:
                raise ActorsLostDuringSync({actor: e}) from e
            except Exception as e:
                cause = getattr(e, "cause", None) or e  # the actor's own error, not Ray's wrapper
                raise RuntimeError(
                    f"a rollout actor could not join the weight-sync group ({backend}): {cause}"
                ) from e
        return group.result()
