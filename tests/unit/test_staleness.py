"""Which streamed samples are too stale to train on, by the job's rule, and what dropping them
cost: a scripted run in which short samples keep the trainer stepping while a long one generates
across five weight versions."""

from __future__ import annotations

import queue
import time
from types import SimpleNamespace

import pytest

from rollout.actors.messages import CompletedGroup, FinishedSample
from rollout.engine.sampling_params import SamplingParams
from trainers.job.config_trainer import STALENESS_RULES, TrainerConfig
from trainers.trl_adapter.staleness import StalenessGate, sample_version, trl_version

pytest.importorskip("trl")

LONG = 600  # tokens of the long samples: 100 under each of versions 0..5


def test_each_rule_reads_the_sample_version_from_its_tokens() -> None:
    runs = [(100, 0), (300, 1), (100, 4)]
    assert sample_version(runs, (0, 4), "first_token") == 0
    assert sample_version(runs, (0, 4), "last_token") == 4
    assert sample_version(runs, (0, 4), "mean_token") == pytest.approx((300 + 400) / 500)
    # A multi-turn episode knows only its start and end versions.
    assert sample_version(None, (2, 5), "mean_token") == 3.5
    assert sample_version(None, (2, 5), "last_token") == 5
    assert trl_version(3.5) == 3 and trl_version(4.0) == 4


def _sample(group_id: int, index: int, runs: list[tuple[int, int]]) -> FinishedSample:
    tokens = sum(n for n, _ in runs)
    return FinishedSample(
        group_id=group_id, attempt=0, sample_index=index, prompt_token_ids=[5, 6],
        token_ids=[7 + index] * tokens, logprobs=[-1.0] * tokens, finish_reason="length",
        error=None, weight_versions=(runs[0][1], runs[-1][1]), actor=0, received_at=0.0,
        finished_at=0.0, token_versions=runs,
    )  # fmt: skip


class _ScriptedPool:
    """Ten short groups (2 samples of 4 tokens, generated at the version the trainer is then
    at: two groups per step), then the long group, started at version 0 and finished at 5;
    `sibling`: its second sample is short, done at version 0, waiting for the long one."""

    def __init__(self, sibling: bool = False) -> None:
        self.script = [
            [_sample(g, j, [(4, g // 2)]) for j in range(2)] for g in range(10)
        ]  # fmt: skip
        long = [_sample(10, j, [(100, v) for v in range(6)]) for j in range(2)]
        if sibling:
            long[1] = _sample(10, 1, [(4, 0)])
        self.script.append(long)
        self.submitted = 0
        self._done: queue.Queue = queue.Queue()

    def submit(self, prompt_ids, params, **kwargs) -> int:
        group_id = self.submitted
        self.submitted += 1
        if group_id < len(self.script):
            group = CompletedGroup(group_id, self.script[group_id], {"submitted_at": 0.0})
            self._done.put(group)
        return group_id

    def get(self, timeout=None) -> CompletedGroup:
        return self._done.get(timeout=timeout)


def _run(rule: str, sibling: bool = False) -> tuple[list[int], dict]:
    """The scripted run under `rule`, consumed as AsyncGRPOTrainer does: four samples a step,
    then a sync (version + 1); returns the lengths handed to the trainer and the counts."""
    from trainers.trl_adapter.rollout_worker import PoolRolloutWorker

    def longer_is_better(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    formatter = SimpleNamespace(
        prompt_ids=lambda prompt: [5, 6], completion=lambda ids, p: "a" * len(ids)
    )
    worker = PoolRolloutWorker(
        _ScriptedPool(sibling), [{"prompt": "w3 w4"}], formatter, [longer_is_better],
        SamplingParams(n=2, max_tokens=LONG), max_inflight_groups=11, max_staleness=2,
        staleness=rule,
    )  # fmt: skip
    worker.start()
    trained = []
    gate = worker.rollout_buffer
    deadline = time.monotonic() + 60
    try:
        while len(trained) + gate.counts.dropped_samples < 22:  # every scripted sample
            assert time.monotonic() < deadline, (trained, gate.counts)
            try:
                sample = gate.get(timeout=0.5)
            except queue.Empty:  # a dropped sample's get may end with nothing left
                worker.check_health(stale_after_s=60)
                continue
            trained.append(int(sample.completion_mask.sum()))
            if len(trained) % 4 == 0:
                worker.update_model_version(worker.model_version + 1)
    finally:
        worker.stop()
    worker.check_health(stale_after_s=60)
    return trained, worker.rollout_buffer.counts.summary()


def test_the_default_rule_never_drops_a_sample_for_being_long() -> None:
    default = TrainerConfig().staleness
    assert default in STALENESS_RULES
    trained, counts = _run(default)
    assert trained.count(LONG) == 2, "the long samples were trained on"
    assert counts["dropped_samples"] == 0 and counts["dropped_tokens"] == 0
    assert counts["trained_mean_length"] == counts["generated_mean_length"]


@pytest.mark.parametrize("rule", ["first_token", "mean_token"])
def test_rules_that_age_long_samples_drop_them_and_count_it(rule: str) -> None:
    trained, counts = _run(rule)
    assert LONG not in trained and len(trained) == 20
    assert counts["dropped_samples"] == 2 and counts["dropped_tokens"] == 2 * LONG
    assert counts["trained_mean_length"] == 4
    assert counts["generated_mean_length"] == pytest.approx((20 * 4 + 2 * LONG) / 22)


def test_token_versions_follow_each_update_a_sample_lived_through() -> None:
    from rollout.actors.groups_in_flight import token_versions

    updates = [(1, {0: 3, 1: 0}), (2, {0: 3, 1: 5}), (3, {0: 9, 1: 8})]
    assert token_versions(0, updates, 0, 10) == [(3, 0), (6, 2), (1, 3)]
    # Sample 1 had not started (a fork still pending) at the first update.
    assert token_versions(0, updates, 1, 8) == [(5, 1), (3, 2)]
    assert token_versions(4, [], 0, 7) == [(7, 4)]


def test_planned_lengths_draw_each_samples_length_clipped_and_seeded() -> None:
    from trainers.trl_adapter.planned_lengths import PlannedLengths

    sampling = SamplingParams(max_tokens=512, n=64, temperature=1.0)
    first = PlannedLengths(24, 1.2, 4, 512, seed=3).params_for(sampling)
    again = PlannedLengths(24, 1.2, 4, 512, seed=3).params_for(sampling)
    assert first.sample_lengths == again.sample_lengths and first.ignore_eos
    lengths = sorted(first.sample_lengths)
    assert len(lengths) == 64 and 4 <= lengths[0] and lengths[-1] <= 512
    assert lengths[0] < 24 < lengths[-1], "a heavy tail on both sides of the median"
    fixed = PlannedLengths(10, 0.0, 4, 512).params_for(sampling)
    assert set(fixed.sample_lengths) == {10}


def test_group_last_token_keeps_a_long_samples_short_sibling() -> None:
    """The sibling finished at version 0 and waited for the long sample: by its own newest token
    it is 5 versions old and dropped; by its group's it is as fresh as the long one."""
    trained, counts = _run("last_token", sibling=True)
    assert trained.count(LONG) == 1 and counts["dropped_samples"] == 1
    trained, counts = _run("group_last_token", sibling=True)
    assert trained.count(LONG) == 1 and counts["dropped_samples"] == 0


def test_bounded_admission_holds_prompts_the_trainer_would_take_too_late() -> None:
    version = [0]
    gate = StalenessGate(2, lambda: version[0])
    assert gate.admits(4, in_flight=40, max_staleness=2), "the pace is unknown: admit"
    for _ in range(12):
        gate.put_sample(object(), 0, 10)
    for _ in range(2):  # the trainer takes 4 samples a version
        for _ in range(4):
            gate.get()
        version[0] += 1
    assert gate.samples_per_version() == 4
    # 4 queued + 4 generating + 4 new: the new group's last sample is 12 samples (3 versions)
    # behind, within max_staleness=2 (+ the version it is generated in).
    assert gate.admits(4, in_flight=4, max_staleness=2)
    assert not gate.admits(4, in_flight=8, max_staleness=2)
    assert gate.admits(4, in_flight=8, max_staleness=3)
    empty = StalenessGate(2, lambda: version[0])
    assert empty.admits(64, in_flight=0, max_staleness=0), "nothing ahead: always admit"
