"""The per-step time split read from TRL's streaming trainer logs."""

from __future__ import annotations

from trainers.trl_adapter.rollout_logging import step_time_split


def test_medians_of_each_part() -> None:
    history = [
        {"perf/step_s": 3.0, "perf/rollout_wait_s": 1.0, "perf/fwd_bwd_s": 1.5, "loss": 0.1},
        {"perf/step_s": 5.0, "perf/rollout_wait_s": 2.0, "perf/fwd_bwd_s": 2.5},
        {"perf/step_s": 4.0, "perf/rollout_wait_s": 9.0, "perf/weight_sync_s": 0.2},
    ]
    split = step_time_split(history)
    # other: 3 - 2.5 = 0.5, 5 - 4.5 = 0.5, 4 - 9.2 = -5.2 (a wait logged a step late) -> median 0.5
    assert split == {
        "step": 4.0,
        "rollout_wait": 2.0,
        "train_fwd_bwd": 2.0,
        "weight_sync": 0.2,
        "other": 0.5,
    }


def test_none_when_the_trainer_logged_no_timings() -> None:
    assert step_time_split([{"loss": 1.0}]) is None
