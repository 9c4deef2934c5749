"""The pool's weight-sync group (rollout/actors/pool_weights.py) with a stand-in for Ray: an actor
that dies between the pool's last look and its join is reported as lost at once, so the pool
syncs the survivors, instead of failing the sync while the others wait for the dead one; and a
receiver that died or failed mid-sync stops the trainer's sends before the next bucket."""

from __future__ import annotations

import threading
import types

import pytest

from rollout.actors import pool_weights
from rollout.actors.pool_weights import ActorsLostDuringSync, ActorWeightSync


class _ActorDied(Exception):
    """Stands for ray.exceptions.RayActorError."""


class _Ray:
    """Join calls end as scripted: "ok", "dead" (the actor died), "error", or never ("waits":
    the member waits for the others, as a live actor's join does while one is missing)."""

    exceptions = types.SimpleNamespace(RayActorError=_ActorDied)
    util = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes

    def actors(self) -> dict[int, object]:
        def actor(i: int):
            join = types.SimpleNamespace(remote=lambda *args, i=i: ("join", i))
            return types.SimpleNamespace(join_weight_group=join)

        return {i: actor(i) for i in range(len(self.outcomes))}

    def wait(self, refs: list, num_returns: int):
        ready = [r for r in refs if self.outcomes[r[1]] != "waits"]
        assert ready, "every remaining join waits: a real wait would block here"
        return ready[:num_returns], [r for r in refs if r not in ready[:num_returns]]

    def get(self, ref):
        outcome = self.outcomes[ref[1]]
        if outcome == "dead":
            raise _ActorDied(f"actor {ref[1]} was killed")
        if outcome == "error":
            raise ValueError(f"actor {ref[1]} refused")
        return None


@pytest.fixture
def group_build(monkeypatch):
    """Rank 0's end of the group: waits until released (the members' side never completes)."""
    release = threading.Event()
    built = []

    class Group:
        def __init__(self, *args) -> None:
            release.wait(timeout=30)
            built.append(args)

    monkeypatch.setattr(pool_weights, "WeightGroup", Group)
    yield built
    release.set()


def test_an_actor_dead_at_the_join_is_reported_lost_while_the_others_wait(group_build) -> None:
    ray = _Ray(["waits", "dead", "waits"])
    with pytest.raises(ActorsLostDuringSync) as lost:
        ActorWeightSync(ray)._join(ray.actors(), "gloo")
    assert set(lost.value.dead) == {1}
    assert "killed" in str(lost.value.dead[1])


def test_a_join_that_fails_otherwise_is_an_error_naming_it(group_build) -> None:
    ray = _Ray(["waits", "error"])
    with pytest.raises(RuntimeError, match=r"could not join the weight-sync group \(gloo\): "
                       r"actor 1 refused") as err:  # fmt: skip
        ActorWeightSync(ray)._join(ray.actors(), "gloo")
    assert not isinstance(err.value, ActorsLostDuringSync)


class _Receives(_Ray):
    """Receive calls that have ended ("dead", "error") or are still waiting for buckets ("ok":
    they end well once the trainer has sent everything)."""

    def wait(self, refs: list, num_returns: int, timeout: float | None = None):
        ended = [r for r in refs if self.outcomes[r[1]] != "ok"]
        return ended, [r for r in refs if r not in ended]


class _Group:
    def close(self) -> None:
        pass


def _sync(outcomes: list[str], buckets: int = 5) -> tuple[list[int], Exception | None]:
    """Run one sync of `buckets` buckets to actors whose receives end as `outcomes`: the buckets
    the trainer got to, and what the sync raised."""
    ray = _Receives(outcomes)
    live = {
        i: types.SimpleNamespace(receive=lambda i=i: ("receive", i)) for i in range(len(outcomes))
    }
    sync = ActorWeightSync(ray)
    sync._group, sync._members = _Group(), (tuple(live), "gloo")  # the group exists already
    sent: list[int] = []

    def transmit(group, check) -> int:
        for k in range(buckets):
            check()
            sent.append(k)
        return buckets

    try:
        sync._run(live, "gloo", receive=lambda actor: actor.receive(), transmit=transmit)
    except Exception as err:  # noqa: BLE001 - returned for the test to look at
        return sent, err
    return sent, None


def test_a_sync_sends_every_bucket_while_its_receivers_wait() -> None:
    assert _sync(["ok", "ok"]) == ([0, 1, 2, 3, 4], None)


def test_a_receiver_that_failed_stops_the_sync_before_the_next_bucket_with_its_error() -> None:
    sent, err = _sync(["ok", "error"])
    assert sent == []
    assert isinstance(err, RuntimeError) and not isinstance(err, ActorsLostDuringSync)
    assert "failed to receive the weights: actor 1 refused" in str(err)


def test_a_receiver_that_died_stops_the_sync_and_is_named() -> None:
    sent, err = _sync(["dead", "ok"])
    assert sent == []
    assert isinstance(err, ActorsLostDuringSync) and set(err.dead) == {0}
