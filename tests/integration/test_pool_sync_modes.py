"""The pool's two lighter weight syncs over gloo, with Ray actors: full weights pulled bucket by
bucket (as a trainer sharded with FSDP2 gathers them), and a LoRA adapter merged on the actors."""

from __future__ import annotations

import weakref

import pytest
import torch

from rollout import LLMEngine, SamplingParams
from rollout.weight_sync import WeightGroup, manifest_from_specs
from tests.conftest import random_prompts, tiny_model
from tests.integration.test_pool import _assert_probe_matches, _config, _wait_until_dead
from tests.integration.test_worker_adapter import lora_adapter, merged

ray = pytest.importorskip("ray")

BUCKET_BYTES = 16 << 10  # several buckets for the tiny model


class _Gathering:
    """Stands in for a sharded trainer: each tensor is made (as `full_tensor()` would) when it
    is pulled. Records pulls and the trainer's broadcasts in one timeline, with how many pulled
    tensors were still alive at each broadcast."""

    def __init__(self, model: torch.nn.Module, monkeypatch) -> None:
        self.model = model
        self.specs = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        self.events: list[tuple[str, object]] = []
        self._alive: list[weakref.ref] = []
        real_broadcast = WeightGroup.broadcast

        def broadcast(group, tensor):  # the driver's end only: actors are other processes
            self.events.append(("send", sum(r() is not None for r in self._alive)))
            real_broadcast(group, tensor)

        monkeypatch.setattr(WeightGroup, "broadcast", broadcast)

    def gather(self, name: str, param: torch.Tensor) -> torch.Tensor:
        full = param.detach().clone()
        self._alive.append(weakref.ref(full))
        self.events.append(("pull", name))
        return full

    def tensors(self, order: list[str] | None = None):
        params = dict(self.model.named_parameters())
        names = order or list(params)
        return ((n, self.gather(n, params[n])) for n in names)  # holds no tensor between pulls


def test_a_sync_from_specs_pulls_each_bucket_just_before_sending_it(
    ray_cluster, model_dir, monkeypatch
) -> None:
    from rollout.actors.pool import RolloutPool

    trainer = tiny_model("llama", seed=99)
    gathering = _Gathering(trainer, monkeypatch)
    buckets = manifest_from_specs(gathering.specs, torch.float32, BUCKET_BYTES).buckets()
    assert len(buckets) > 3
    pool = RolloutPool(_config(model_dir), num_actors=2, weight_bucket_bytes=BUCKET_BYTES)
    try:
        result = pool.sync_weights(
            gathering.tensors(), version=1, specs=gathering.specs, device="cpu"
        )
        assert result["version"] == 1
        # pull* send, bucket after bucket: every tensor of bucket k is pulled before bucket k
        # is sent, none of bucket k + 1, and none is alive any more when it goes out.
        timeline, pulled = [], []
        for kind, what in gathering.events:
            if kind == "pull":
                pulled.append(what)
            else:
                timeline.append((pulled, what))
                pulled = []
        names = [n for n, _ in gathering.specs]
        assert timeline == [([names[i] for i in bucket], 0) for bucket in buckets]

        probe_prompt = random_prompts((6,), seed=33)[0]
        for actor in (0, 1):
            _assert_probe_matches(pool, trainer, probe_prompt, version=1, actor=actor)

        # Tensors out of the specs' order: refused, naming both.
        order = [names[1], names[0], *names[2:]]
        with pytest.raises(ValueError, match=f"{names[0]}.*{names[1]}"):
            pool.sync_weights(
                gathering.tensors(order), version=2, specs=gathering.specs, device="cpu"
            )
        with pytest.raises(ValueError, match="needs device="):
            pool.sync_weights(gathering.tensors(), version=2, specs=gathering.specs)
        _assert_probe_matches(pool, trainer, probe_prompt, version=1)  # nothing was copied in
    finally:
        pool.shutdown()


def test_an_actor_lost_during_a_sync_from_specs_is_named_not_retried(
    ray_cluster, model_dir, monkeypatch
) -> None:
    from rollout.actors.pool import RolloutPool

    trainer = tiny_model("llama", seed=99)
    gathering = _Gathering(trainer, monkeypatch)
    pool = RolloutPool(_config(model_dir), num_actors=2, weight_bucket_bytes=BUCKET_BYTES)
    try:
        pool.sync_weights(trainer.named_parameters(), version=1)  # the group exists
        sends = []

        def tensors():
            for i, (name, tensor) in enumerate(gathering.tensors()):
                if i == 3:  # the first bucket went out
                    ray.kill(pool.actors[1], no_restart=True)
                    _wait_until_dead(pool.actors[1])
                sends.append(name)
                yield name, tensor

        with pytest.raises(RuntimeError, match=r"rollout actor\(s\) \[1\] died during"):
            pool.sync_weights(tensors(), version=2, specs=gathering.specs, device="cpu")
        assert 1 in pool.dead and pool.version == 1
        # The pool checks its actors before each bucket: the death stops the pulls there.
        names = [n for n, _ in gathering.specs]
        assert sends == names[: len(sends)], "a tensor was pulled twice or out of order"
        assert len(sends) < len(gathering.specs), "the sync went on after the death"

        result = pool.sync_weights(
            gathering.tensors(), version=2, specs=gathering.specs, device="cpu"
        )
        assert result["version"] == 2
        _assert_probe_matches(pool, trainer, random_prompts((6,), seed=33)[0], version=2)
    finally:
        pool.shutdown()


def test_adapter_syncs_merge_from_the_base_on_every_actor(ray_cluster, model_dir) -> None:
    from rollout.actors.pool import RolloutPool

    base_model = tiny_model("llama", seed=4)  # the actors' checkpoint
    base = {n: p.detach().clone() for n, p in base_model.named_parameters()}
    prompts = random_prompts((5, 9), seed=21)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    pool = RolloutPool(_config(model_dir), num_actors=2)
    try:
        for version, seed in ((1, 10), (2, 11)):
            adapter = lora_adapter(base_model, seed)
            result = pool.sync_adapter(adapter, version=version)
            assert result["version"] == version
            assert result["bytes"] == 4 * sum(a.numel() + b.numel() for _, a, b, _ in adapter)
            reference = tiny_model("llama", seed=4)
            reference.load_state_dict({**base, **merged(base, adapter)})
            for actor in (0, 1):
                _assert_probe_matches(pool, reference, prompts[0], version=version, actor=actor)
        local = LLMEngine.from_model(reference, _config(model_dir)).generate(prompts, greedy)
        for i, p in enumerate(prompts):
            pool.submit(p, greedy, {"prompt": i})
        for _ in prompts:
            group = pool.get(timeout=120)
            assert group.samples[0].token_ids == local[group.metadata["prompt"]].token_ids

        module, lora_a, lora_b, scaling = adapter[0]
        refused = {
            "model.layers.0.mlp.nope": [*adapter, ("model.layers.0.mlp.nope", lora_a, lora_b, 1.0)],
            r"q_proj: adapter is for": [(module, lora_a[:, 1:], lora_b, scaling), *adapter[1:]],
            r"left out: \['model.layers.1.mlp.down_proj'\]": adapter[:2],
        }
        for message, wrong in refused.items():
            with pytest.raises(ValueError, match=message):
                pool.sync_adapter(wrong, version=3)
        _assert_probe_matches(pool, reference, prompts[0], version=2)  # unchanged
    finally:
        pool.shutdown()
