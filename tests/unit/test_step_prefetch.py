"""Next-step micro-batch building (trainers.step_prefetch), against a stand-in trainer shaped like
TRL's streaming one: same batches in the same order, built a step ahead and no further, checked
against the version they train under, metrics kept with their step, failures raised."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest

from trainers.step_prefetch import NextStepBatches


class StandInTrainer:
    """The attributes NextStepBatches reads; micro-batch i is the integer i."""

    def __init__(self, max_steps: int, accumulation: int, weight_sync_steps: int = 1) -> None:
        self.args = SimpleNamespace(
            max_steps=max_steps,
            gradient_accumulation_steps=accumulation,
            weight_sync_steps=weight_sync_steps,
        )
        self.state = SimpleNamespace(global_step=0)
        self.model_version = 1  # TRL's cold sync before the first step
        self.accelerator = SimpleNamespace(num_processes=1)
        self._metrics = {"train": defaultdict(list)}
        sink = self._metrics["train"]
        # TRL's RolloutQueueDataset; the trainer's attribute is where TRL reads the rollout wait.
        self.source = SimpleNamespace(
            metrics=sink, model_version_fn=lambda: self.model_version, wait_s=0.0
        )
        self._rollout_dataset = self.source
        self.loader = SimpleNamespace(
            dataset=SimpleNamespace(metrics=sink), collate_fn=SimpleNamespace(metrics=sink)
        )
        self.built: list[int] = []  # micro-batches pulled from the iterator, in order
        self.versions: list[int] = []  # the version the staleness check saw for each
        self.gate = threading.Event()  # cleared: the iterator waits (rollouts not ready)
        self.gate.set()
        self.fail_at: int | None = None

    def get_train_dataloader(self):
        return self.loader

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        raise AssertionError("the trainer's own batching should have been replaced")

    def _get_num_items_in_batch(self, batches, device):
        return len(batches)

    def iterator(self, length: int | None = None):
        i = 0
        while length is None or i < length:
            self.gate.wait()
            if self.fail_at == i:
                raise ValueError("rollout worker died")
            self.versions.append(self.source.model_version_fn())
            self.source.metrics["built"].append(i)
            self.built.append(i)
            yield i
            i += 1

    def end_step(self) -> None:
        """What TRL does after the optimizer step: count it, sync weights every N steps."""
        self.state.global_step += 1
        if self.state.global_step % self.args.weight_sync_steps == 0:
            self.model_version += 1


def installed(trainer: StandInTrainer) -> NextStepBatches:
    prefetch = NextStepBatches(trainer)
    prefetch.install()
    trainer.get_train_dataloader()
    assert prefetch.enabled
    return prefetch


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_same_batches_in_order_built_one_step_ahead_and_not_past_the_run() -> None:
    trainer = StandInTrainer(max_steps=3, accumulation=4)
    installed(trainer)
    it = trainer.iterator()
    for step in range(3):
        batches, items = trainer.get_batch_samples(it, 4, "cpu")
        assert batches == list(range(4 * step, 4 * step + 4))
        assert items == 4
        # While this step "trains", the next step's micro-batches get built, and no more.
        expected = min(4 * (step + 2), 12)
        wait_for(lambda expected=expected: len(trainer.built) == expected)
        time.sleep(0.05)
        assert len(trainer.built) == expected
        trainer.end_step()


@pytest.mark.parametrize("sync_every", [1, 2])
def test_staleness_is_checked_against_the_version_the_batch_trains_under(sync_every) -> None:
    trainer = StandInTrainer(max_steps=4, accumulation=2, weight_sync_steps=sync_every)
    installed(trainer)
    it = trainer.iterator()
    trained_under = []
    for _ in range(4):
        batches, _ = trainer.get_batch_samples(it, 2, "cpu")
        trained_under += [trainer.model_version] * len(batches)
        ahead = min(len(trained_under) + 2, 8)
        wait_for(lambda ahead=ahead: len(trainer.built) >= ahead)
        trainer.end_step()
    assert trainer.versions == trained_under


def test_metrics_reach_the_log_with_the_step_that_trains_them() -> None:
    trainer = StandInTrainer(max_steps=2, accumulation=3)
    installed(trainer)
    it = trainer.iterator()
    trainer.get_batch_samples(it, 3, "cpu")
    wait_for(lambda: len(trainer.built) == 6)
    assert trainer._metrics["train"]["built"] == [0, 1, 2]
    trainer.end_step()
    trainer.get_batch_samples(it, 3, "cpu")
    assert trainer._metrics["train"]["built"] == [0, 1, 2, 3, 4, 5]


def test_rollout_wait_is_the_training_loops_own_wait() -> None:
    trainer = StandInTrainer(max_steps=2, accumulation=2)
    installed(trainer)
    it = trainer.iterator()
    trainer.gate.clear()
    threading.Timer(0.3, trainer.gate.set).start()
    trainer.get_batch_samples(it, 2, "cpu")
    assert trainer._rollout_dataset.wait_s >= 0.25  # TRL reads and resets this per step
    trainer._rollout_dataset.wait_s = 0.0
    wait_for(lambda: len(trainer.built) == 4)
    trainer.end_step()
    trainer.get_batch_samples(it, 2, "cpu")
    assert trainer._rollout_dataset.wait_s < 0.1, "built during the step before: no wait"


def test_a_failure_while_building_is_raised_in_the_training_loop() -> None:
    trainer = StandInTrainer(max_steps=3, accumulation=2)
    trainer.fail_at = 3
    installed(trainer)
    it = trainer.iterator()
    assert trainer.get_batch_samples(it, 2, "cpu")[0] == [0, 1]
    trainer.end_step()
    with pytest.raises(RuntimeError, match="micro-batches") as caught:
        trainer.get_batch_samples(it, 2, "cpu")
    assert isinstance(caught.value.__cause__, ValueError)


def test_an_exhausted_iterator_returns_what_it_had_then_a_new_one_goes_on() -> None:
    trainer = StandInTrainer(max_steps=0, accumulation=2)  # no max_steps: no end known
    installed(trainer)
    first = trainer.iterator(length=3)
    assert trainer.get_batch_samples(first, 2, "cpu")[0] == [0, 1]
    assert trainer.get_batch_samples(first, 2, "cpu")[0] == [2]
    second = trainer.iterator(length=2)
    assert trainer.get_batch_samples(second, 2, "cpu")[0] == [0, 1]


def test_off_when_the_loader_is_not_laid_out_as_expected() -> None:
    trainer = StandInTrainer(max_steps=2, accumulation=2)
    trainer.loader.collate_fn = SimpleNamespace()  # a TRL whose collator keeps no metrics
    prefetch = NextStepBatches(trainer)
    prefetch.install()
    trainer.get_train_dataloader()
    assert not prefetch.enabled
    with pytest.raises(AssertionError, match="own batching"):
        trainer.get_batch_samples(trainer.iterator(), 2, "cpu")
