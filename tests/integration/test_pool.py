"""Ray rollout actors through the RolloutPool: streaming, actor death, weight sync over gloo."""

from __future__ import annotations

import queue

import pytest
import torch

from rollout import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import random_prompts, tiny_model

ray = pytest.importorskip("ray")


def _config(model_dir: str, **overrides) -> EngineConfig:
    settings = dict(
        model=model_dir, device="cpu", dtype="float32", max_model_len=128, block_size=8,
        max_num_seqs=16, num_kv_blocks=64,
    )  # fmt: skip
    settings.update(overrides)
    return EngineConfig(**settings)


def _drain(pool, count: int, timeout: float = 120.0) -> list:
    groups = []
    while len(groups) < count:
        groups.append(pool.get(timeout=timeout))
    return groups


def test_pool_streams_groups_that_match_a_local_engine(ray_cluster, model_dir) -> None:
    from rollout.actors.pool import RolloutPool

    prompts = random_prompts((3, 7, 12, 5, 9), seed=31)
    params = [SamplingParams(max_tokens=10 + 3 * i, n=3, seed=100 + i) for i in range(5)]
    pool = RolloutPool(_config(model_dir), num_actors=2)
    try:
        ids = [
            pool.submit(p, sp, {"prompt": i})
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        ]
        groups = _drain(pool, 5)
        with pytest.raises(queue.Empty):
            pool.get(timeout=0.5)  # exactly once: nothing more comes
        assert sorted(g.group_id for g in groups) == sorted(ids)
        assert {s.actor for g in groups for s in g.samples} == {0, 1}, (
            "work spread over both actors"
        )
        local = LLMEngine(_config(model_dir)).generate(prompts, params)
        for g in groups:
            i = g.metadata["prompt"]
            assert [s.sample_index for s in g.samples] == [0, 1, 2]
            assert [s.token_ids for s in g.samples] == [
                c.token_ids for c in local[3 * i : 3 * i + 3]
            ]
            assert all(s.weight_versions == (0, 0) for s in g.samples)
        stats = pool.actor_metrics()
        assert sum(s["total_sequences"] for s in stats.values()) == 15
        assert all(s["queue_wait_s"] >= 0 for s in stats.values())
        assert max(s["latency_s"] for s in stats.values()) > 0
    finally:
        pool.shutdown()


def test_speculating_actors_stream_the_plain_tokens_and_report_acceptance(
    ray_cluster, model_dir
) -> None:
    from rollout.actors.pool import RolloutPool

    prompts = random_prompts((3, 7, 12), seed=33)
    params = SamplingParams(max_tokens=40, n=2, seed=7, temperature=0)
    pool = RolloutPool(_config(model_dir, speculative="ngram"), num_actors=1)
    try:
        for i, p in enumerate(prompts):
            pool.submit(p, params, {"prompt": i})
        groups = _drain(pool, 3)
        local = LLMEngine(_config(model_dir)).generate(prompts, params)
        for g in groups:
            i = g.metadata["prompt"]
            assert [s.token_ids for s in g.samples] == [
                c.token_ids for c in local[2 * i : 2 * i + 2]
            ]
        (stats,) = pool.actor_metrics().values()
        assert stats["spec_verifications"] > 0
        assert 0 < stats["spec_acceptance_rate"] <= 1
        assert stats["spec_tokens_per_verification"] > 1
    finally:
        pool.shutdown()


def test_a_dead_actor_loses_nothing(ray_cluster, model_dir) -> None:
    from rollout.actors.pool import RolloutPool

    pool = RolloutPool(_config(model_dir), num_actors=2)
    reported = []
    pool.on_actor_death = reported.append
    try:
        prompts = random_prompts([4] * 8, seed=32)
        ids = [
            pool.submit(p, SamplingParams(max_tokens=100, n=2, ignore_eos=True)) for p in prompts
        ]
        first = pool.get(timeout=120)  # rollouts are under way
        pool.kill_actor(0)
        groups = [first, *_drain(pool, 7)]
        with pytest.raises(queue.Empty):
            pool.get(timeout=1.0)
        assert sorted(g.group_id for g in groups) == sorted(ids)
        assert all(len(g.samples) == 2 for g in groups)
        assert all(len(s.token_ids) == 100 for g in groups for s in g.samples)
        assert 0 in pool.dead
        assert [(d.actor, d.live_actors) for d in reported] == [(0, 1)], "reported once"
        assert pool.deaths == reported
        assert any(s.actor == 1 and s.attempt == 1 for g in groups for s in g.samples), (
            "the dead actor's groups were generated again on the other"
        )
    finally:
        pool.shutdown()


def _trainer_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _assert_probe_matches(pool, trainer, prompt: list[int], version: int, **probe_args) -> None:
    """An actor's probe was generated under `version` and its logprobs equal the trainer's."""
    probe = pool.probe(prompt, max_tokens=12, **probe_args)
    fresh = _trainer_logprobs(trainer, prompt, probe["token_ids"])
    assert probe["version"] == version
    assert (fresh - torch.tensor(probe["logprobs"])).abs().max().item() < 1e-4


def test_weight_sync_over_gloo_matches_the_trainer(ray_cluster, model_dir) -> None:
    from rollout.actors.pool import RolloutPool

    trainer = tiny_model("llama", seed=99)  # different weights from the actors'
    pool = RolloutPool(_config(model_dir), num_actors=2)
    probe_prompt = random_prompts((6,), seed=33)[0]
    try:
        before = pool.probe(probe_prompt, max_tokens=12)
        stale = _trainer_logprobs(trainer, probe_prompt, before["token_ids"])
        assert (stale - torch.tensor(before["logprobs"])).abs().max() > 1e-2

        result = pool.sync_weights(trainer.named_parameters(), version=1)
        assert result["version"] == 1 and result["bytes"] > 0
        for actor in (0, 1):
            _assert_probe_matches(pool, trainer, probe_prompt, version=1, actor=actor)

        # Samples generated after the sync carry the new version.
        pool.submit(probe_prompt, SamplingParams(max_tokens=5, n=2))
        assert pool.get(timeout=60).weight_versions == (1, 1)

        # A mismatched sync is refused by name and leaves the weights whole.
        named = [(n, p) for n, p in trainer.named_parameters() if n != "lm_head.weight"]
        named.append(("lm_head.extra", torch.zeros(3)))
        with pytest.raises(Exception, match="lm_head"):
            pool.sync_weights(named, version=2)
        _assert_probe_matches(pool, trainer, probe_prompt, version=1)
    finally:
        pool.shutdown()


def test_an_actor_that_cannot_join_the_weight_group_fails_the_sync_at_once(
    ray_cluster, model_dir
) -> None:
    """The trainer's side of the group waits for every member; an actor that cannot join (here:
    CUDA IPC asked of a CPU engine) must surface its error, not leave the trainer waiting."""
    import time

    from rollout.actors.pool import RolloutPool

    trainer = tiny_model("llama", seed=99)
    pool = RolloutPool(_config(model_dir), num_actors=1)
    try:
        start = time.perf_counter()
        with pytest.raises(RuntimeError, match="could not join.*needs the engine on a GPU"):
            pool.sync_weights(trainer.named_parameters(), backend="cuda_ipc")
        assert time.perf_counter() - start < 60
        result = pool.sync_weights(trainer.named_parameters(), backend="gloo")  # still usable
        assert result["version"] == 1
    finally:
        pool.shutdown()


def test_a_sync_right_after_an_actor_died_goes_to_the_others(ray_cluster, model_dir) -> None:
    """An actor dead before the pool noticed: the sync must not fail the trainer; the dead
    actor's groups move to the survivor and come back exactly once."""
    from rollout.actors.pool import RolloutPool

    trainer = tiny_model("llama", seed=99)
    pool = RolloutPool(_config(model_dir), num_actors=2)
    try:
        prompts = random_prompts((5, 7, 6, 4), seed=12)
        ids = {pool.submit(p, SamplingParams(max_tokens=40, n=2, ignore_eos=True)) for p in prompts}
        ray.kill(pool.actors[1], no_restart=True)  # behind the pool's back
        result = pool.sync_weights(trainer.named_parameters(), version=1)
        assert result["version"] == 1 and 1 in pool.dead
        groups = _drain(pool, len(ids))
        assert {g.group_id for g in groups} == ids
        assert all(len(g.samples) == 2 and not any(s.error for s in g.samples) for g in groups)
        assert pool.probe(random_prompts((6,), seed=33)[0], max_tokens=4)["version"] == 1
    finally:
        pool.shutdown()


def _wait_until_dead(actor, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
        time.sleep(0.1)
    raise AssertionError("the actor did not die")


def test_an_actor_that_dies_during_a_sync_is_dropped_and_the_sync_completes(
    ray_cluster, model_dir, monkeypatch
) -> None:
    """Death after the name/shape check, as the buckets start to move: the survivor's weights are
    torn by the broken transfer, so the pool syncs it again over a group without the dead actor;
    nothing is lost and nothing is generated with torn weights."""
    from rollout.actors import pool_weights
    from rollout.actors.pool import RolloutPool

    trainer = tiny_model("llama", seed=99)
    pool = RolloutPool(_config(model_dir), num_actors=2)
    try:
        pool.sync_weights(tiny_model("llama", seed=4).named_parameters(), version=1)  # the group
        prompts = random_prompts((5, 7, 6, 4), seed=14)
        ids = {pool.submit(p, SamplingParams(max_tokens=40, n=2, ignore_eos=True)) for p in prompts}
        real_send, world_sizes = pool_weights.send_weights, []

        def send_as_an_actor_dies(group, *args, **kwargs):
            if not world_sizes:
                ray.kill(pool.actors[1], no_restart=True)
                _wait_until_dead(pool.actors[1])
            world_sizes.append(group.world_size)
            return real_send(group, *args, **kwargs)

        monkeypatch.setattr(pool_weights, "send_weights", send_as_an_actor_dies)
        result = pool.sync_weights(trainer.named_parameters(), version=2)
        assert result["version"] == 2 and 1 in pool.dead
        assert world_sizes == [3, 2]  # the broken transfer, then the survivor's own group

        groups = _drain(pool, len(ids))
        assert {g.group_id for g in groups} == ids
        assert all(len(g.samples) == 2 and not any(s.error for s in g.samples) for g in groups)
        probe_prompt = random_prompts((6,), seed=33)[0]
        _assert_probe_matches(pool, trainer, probe_prompt, version=2)
    finally:
        pool.shutdown()


def test_an_abort_follows_groups_whose_actor_just_died(ray_cluster, model_dir) -> None:
    from rollout.actors.pool import RolloutPool

    pool = RolloutPool(_config(model_dir), num_actors=2)
    try:
        prompts = random_prompts((5, 7, 6, 4), seed=13)
        params = SamplingParams(max_tokens=100, n=2, ignore_eos=True)
        ids = {pool.submit(p, params) for p in prompts}
        ray.kill(pool.actors[1], no_restart=True)  # behind the pool's back
        pool.abort(sorted(ids))
        groups = _drain(pool, len(ids))
        assert {g.group_id for g in groups} == ids, "every group delivered exactly once"
        for g in groups:
            assert len(g.samples) == 2
            assert all(s.finish_reason in ("abort", "length") and not s.error for s in g.samples)
        assert 1 in pool.dead
    finally:
        pool.shutdown()
