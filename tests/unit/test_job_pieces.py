"""The job's small pieces that hold state between trainer calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainers.parity import ParityProbe
from trainers.summary import RewardLog
from trainers.sync_rollouts import WeightsBeforeGeneration


class RecordingTransfer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def send_weights(self, named) -> None:
        self.calls.append(f"send {len(list(named))}")

    def resume(self) -> None:
        self.calls.append("resume")


def _trainer(step: int):
    model = SimpleNamespace(named_parameters=lambda: iter([("w", 0), ("b", 1)]))
    return SimpleNamespace(state=SimpleNamespace(global_step=step), model=model)


def test_weights_go_to_the_pool_once_per_optimizer_step() -> None:
    transfer = RecordingTransfer()
    sync = WeightsBeforeGeneration(transfer)
    sync(_trainer(0))  # the actors start with the trainer's initial weights
    assert transfer.calls == []
    sync(_trainer(1))
    sync(_trainer(1))  # a second generation in the same step: nothing new to send
    assert transfer.calls == ["pause", "send 2", "resume"]
    sync(_trainer(3))
    assert transfer.calls[-3:] == ["pause", "send 2", "resume"] and len(transfer.calls) == 6


def test_the_parity_probe_needs_the_trainer_model_first() -> None:
    probe = ParityProbe(pool=None, prompt_ids=[1, 2])
    with pytest.raises(AssertionError, match="attach"):
        probe()


def test_reward_log_reads_first_and_last_version_means() -> None:
    log = RewardLog()
    log.groups = [(0, 0.0, 4), (0, 1.0, 4), (2, 0.5, 4), (1, 0.9, 4)]
    assert log.mean_at(first=True) == 0.5
    assert log.mean_at(first=False) == 0.5
    log.read_from_trl_log([{"loss": 1.0}, {"reward": 0.25}, {"reward": 0.75}])
    assert log.mean_at(first=True) == 0.25 and log.mean_at(first=False) == 0.75
