"""A RolloutWorker (no Ray) receiving weights: a transfer that breaks part-way leaves the engine
with a mix of two weight versions, so it must not step, probe or resume until a full sync."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from rollout.actors.messages import GroupRequest
from rollout.weight_sync import TornWeightsError, manifest_for, send_weights
from tests.conftest import random_prompts, tiny_model


class _ReplayGroup:
    """Stands in for the process group: with no buckets it records what the trainer broadcasts;
    with buckets it replays them to a receiver, raising at bucket `fail_at`."""

    backend = "gloo"

    def __init__(self, buckets: list[torch.Tensor] | None = None, fail_at: int | None = None):
        self.recording = buckets is None
        self.buckets = [] if buckets is None else buckets
        self.fail_at = fail_at
        self.calls = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        if self.recording:
            self.buckets.append(tensor.clone())
        elif self.calls == self.fail_at:
            raise RuntimeError(f"connection closed by peer at bucket {self.calls}")
        else:
            tensor.copy_(self.buckets[self.calls])
        self.calls += 1

    def close(self) -> None:
        pass


def test_a_sync_that_breaks_part_way_holds_the_engine_until_a_full_sync(worker) -> None:
    trainer = tiny_model("llama", seed=99)
    named = list(trainer.named_parameters())
    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)  # many small buckets
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))
    assert len(recorded.buckets) > 3

    worker.weights.group = _ReplayGroup(recorded.buckets, fail_at=2)
    with pytest.raises(TornWeightsError, match="at bucket 2"):
        worker.receive_weights(manifest, version=1)

    prompt = random_prompts((6,), seed=5)[0]
    worker.add_groups([GroupRequest(7, prompt, SamplingParams(max_tokens=6, n=2, ignore_eos=True))])
    assert worker.poll(timeout=1.0) == []  # torn weights generate nothing
    with pytest.raises(RuntimeError, match="mix of two weight versions"):
        worker.resume()
    with pytest.raises(RuntimeError, match="mix of two weight versions"):
        worker.probe(prompt, max_tokens=2)

    samples = _sync_and_finish_the_group(worker, recorded.buckets, manifest)
    assert {s.weight_versions for s in samples} == {(0, 1)}  # admitted before, made after
    engine_params = dict(worker.engine.model.named_parameters())
    for name, param in named:
        assert torch.equal(engine_params[name], param.detach()), name


def _sync_and_finish_the_group(worker, buckets, manifest) -> list:
    """Sync version 1 from recorded `buckets`, resume, and wait for the waiting group's two
    samples."""
    worker.weights.group = _ReplayGroup(buckets)
    worker.receive_weights(manifest, version=1)
    worker.resume()
    samples = []
    while len(samples) < 2:
        samples += worker.poll(timeout=30.0)
    return samples


def test_a_sync_of_non_finite_weights_holds_the_engine_until_a_finite_one(worker) -> None:
    """A trainer that diverged sends NaN: the weights are written before they can be checked,
    so the worker refuses to step, probe or resume on them, as on torn ones."""
    trainer = tiny_model("llama", seed=98)
    named = list(trainer.named_parameters())
    with torch.no_grad():
        named[-1][1][0, 0] = float("nan")
    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))

    worker.weights.group = _ReplayGroup(recorded.buckets)
    with pytest.raises(ValueError, match="hold NaN or inf"):
        worker.receive_weights(manifest, version=1)
    prompt = random_prompts((6,), seed=5)[0]
    worker.add_groups([GroupRequest(8, prompt, SamplingParams(max_tokens=4, n=2, ignore_eos=True))])
    assert worker.poll(timeout=1.0) == []  # nothing sampled from NaN weights
    with pytest.raises(RuntimeError, match=f"wrote NaN or inf into {named[-1][0]}"):
        worker.resume()
    with pytest.raises(RuntimeError, match="wrote NaN or inf"):
        worker.probe(prompt, max_tokens=2)

    with torch.no_grad():
        named[-1][1][0, 0] = 0.5
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))
    samples = _sync_and_finish_the_group(worker, recorded.buckets, manifest)
    assert {s.weight_versions for s in samples} == {(0, 1)}


def test_a_sync_that_breaks_before_any_copy_leaves_the_engine_running(worker) -> None:
    trainer = tiny_model("llama", seed=99)
    named = list(trainer.named_parameters())
    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))
    before = {n: p.clone() for n, p in worker.engine.model.named_parameters()}

    worker.weights.group = _ReplayGroup(recorded.buckets, fail_at=0)
    with pytest.raises(RuntimeError, match="at bucket 0") as raised:
        worker.receive_weights(manifest, version=1)
    assert not isinstance(raised.value, TornWeightsError)
    worker.resume()  # the weights are whole: nothing to refuse
    prompt = random_prompts((6,), seed=5)[0]
    worker.add_groups([GroupRequest(3, prompt, SamplingParams(max_tokens=4, n=2, ignore_eos=True))])
    samples = []
    while len(samples) < 2:
        samples += worker.poll(timeout=30.0)
    assert {s.weight_versions for s in samples} == {(0, 0)}
    for name, param in worker.engine.model.named_parameters():
        assert torch.equal(param, before[name]), name


def test_a_receive_that_fails_before_the_transfer_releases_the_trainer(worker, monkeypatch):
    """The trainer's broadcast waits for every member; an engine whose receive fails before the
    first collective (say, out of memory for a bucket) must not leave it waiting out the group's
    timeout: the worker leaves the group, and the trainer's side fails at once."""
    import threading
    import time

    from rollout.actors import weight_receiver
    from rollout.weight_sync import WeightGroup, free_port

    port, trainer_side = free_port(), {}

    def build() -> None:  # rank 0 waits in its store until the worker joins
        trainer_side["group"] = WeightGroup("127.0.0.1", port, 0, 2, "gloo", timeout_s=90)

    builder = threading.Thread(target=build)
    builder.start()
    worker.join_weight_group("127.0.0.1", port, 1, 2, "gloo")
    builder.join(timeout=60)

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("out of memory allocating the bucket")

    monkeypatch.setattr(weight_receiver, "receive_weights", out_of_memory)
    named = list(tiny_model("llama", seed=99).named_parameters())
    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)
    outcome = {}

    def send() -> None:
        try:
            send_weights(trainer_side["group"], manifest, named, torch.device("cpu"))
            outcome["sent"] = True
        except RuntimeError as err:
            outcome["error"] = err

    sender = threading.Thread(target=send, daemon=True)
    start = time.perf_counter()
    sender.start()
    with pytest.raises(RuntimeError, match="out of memory"):
        worker.receive_weights(manifest, version=1)
    sender.join(timeout=30)
    assert not sender.is_alive(), "the trainer's side is still waiting for the failed engine"
    assert time.perf_counter() - start < 30 and "error" in outcome
    assert worker.weights.group is None  # the next sync joins a new group
    worker.resume()  # nothing was copied: the engine runs on


def test_a_weight_sync_empties_the_prefix_cache(worker) -> None:
    """KV cached under the old weights must not serve requests after a sync."""
    prompt = random_prompts((30,), seed=6)[0]
    worker.add_groups([GroupRequest(1, prompt, SamplingParams(max_tokens=10, ignore_eos=True))])
    samples = []
    while not samples:
        samples += worker.poll(timeout=30.0)
    assert worker.engine.stats().cached_kv_blocks > 0
    named = list(tiny_model("llama", seed=99).named_parameters())
    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))
    worker.weights.group = _ReplayGroup(recorded.buckets)
    worker.receive_weights(manifest, version=1)
    assert worker.engine.stats().cached_kv_blocks == 0


def test_each_token_carries_the_weight_version_it_was_generated_with(worker) -> None:
    """Weights change in place mid-sample: its first k tokens are the old model's greedy
    continuation, the rest the new model's over the KV the old one had computed (every position
    before the k-th token's), and its token_versions say exactly that: [(k, 0), (rest, 1)]."""
    from tests.conftest import hf_greedy

    old = tiny_model("llama", seed=4)  # the worker's own weights
    new = tiny_model("llama", seed=99)
    named = list(new.named_parameters())
    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))

    prompt = random_prompts((6,), seed=3)[0]
    length = 60
    params = SamplingParams(max_tokens=length, n=1, temperature=0.0, ignore_eos=True)
    worker.add_groups([GroupRequest(11, prompt, params)])
    while True:  # let it generate a few tokens under the old weights
        lengths = worker.run_between_steps(worker.engine.output_lengths, timeout=30)
        if lengths.get("11", {}).get(0, 0) >= 4:
            break
    worker.weights.group = _ReplayGroup(recorded.buckets)
    worker.receive_weights(manifest, version=1)
    samples = []
    while not samples:
        samples += worker.poll(timeout=30.0)
    (sample,) = samples
    runs = sample.token_versions
    assert [v for _, v in runs] == [0, 1] and sum(n for n, _ in runs) == length, runs
    k = runs[0][0]
    assert 4 <= k < length
    tokens = sample.token_ids
    assert tokens[:k] == hf_greedy(old, prompt, k)
    with torch.no_grad():
        cache = old(input_ids=torch.tensor([prompt + tokens[: k - 1]])).past_key_values
        expected, token = [], tokens[k - 1]
        for _ in range(length - k):
            out = new(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
            expected.append(token)
    assert tokens[k:] == expected
