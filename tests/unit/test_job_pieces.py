"""The job's small pieces that hold state between trainer calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.trainer_doubles import OneProcess, RecordingTransfer
from trainers.trl_adapter.builder import RewardLog
from trainers.trl_adapter.parity import ParityProbe
from trainers.trl_adapter.sync import WeightsBeforeGeneration


def _trainer(step: int):
    import torch

    model = torch.nn.Linear(2, 2)  # two parameters: weight and bias
    return SimpleNamespace(
        state=SimpleNamespace(global_step=step), model=model, accelerator=OneProcess()
    )


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
        probe.run()


def test_reward_log_reads_first_and_last_version_means() -> None:
    log = RewardLog()
    log.groups = [(0, 0.0, 4), (0, 1.0, 4), (2, 0.5, 4), (1, 0.9, 4)]
    assert log.mean_at(first=True) == 0.5
    assert log.mean_at(first=False) == 0.5
    log.read_from_trl_log([{"loss": 1.0}, {"reward": 0.25}, {"reward": 0.75}])
    assert log.mean_at(first=True) == 0.25 and log.mean_at(first=False) == 0.75


# ---- checkpoints ------------------------------------------------------------------------------


def test_the_wandb_run_id_is_kept_by_resumes_and_new_on_a_fresh_start(tmp_path) -> None:
    from trainers.job.checkpoints import wandb_run_id

    first = wandb_run_id(tmp_path)
    assert len(first) == 12 and wandb_run_id(tmp_path) == first
    (tmp_path / "other").mkdir()
    assert wandb_run_id(tmp_path / "other") != first
    # a fresh start in the same directory is a W&B run of its own, which its resumes keep
    fresh = wandb_run_id(tmp_path, resuming=False)
    assert fresh != first and wandb_run_id(tmp_path) == fresh


# ---- the console line -------------------------------------------------------------------------


def test_the_step_line_shows_what_a_person_watches() -> None:
    from trainers.job.console import step_line

    logs = {
        "reward": 0.625,
        "rewards/answer_format/mean": 0.81,
        "rewards/answer_format/std": 0.2,
        "rollout/tokens_per_s": 1234.5,
        "rollout/staleness": 0.5,
        "rollout/weight_sync_s": 0.714,
        "perf/step_s": 31.2,
        "loss": 0.01,
    }
    line = step_line(logs, 3, 8, step_s=99.0)
    assert line == (
        "[step 3/8] reward 0.62 (answer_format 0.81) | rollout 1,234 tok/s | staleness 0.5 | "
        "sync 0.71 s | step 31.2 s"
    )
    assert step_line({"loss": 1.0}, 1, 2, step_s=4.0) == "[step 1/2] step 4.0 s"


# ---- start-up checks and error samples --------------------------------------------------------


class WordFormatter:
    def prompt_ids(self, prompt: str) -> list[int]:
        return list(range(len(prompt.split())))


def _config(*overrides: str):
    from trainers.job.config_loading import load_config

    return load_config(None, ["rollout.engine={max_model_len: 4}", *overrides])


def test_too_long_prompts_refuse_the_run_or_are_dropped_when_asked() -> None:
    import datasets

    from trainers.job.preflight import JobInputError, _fitting_prompts

    rows = datasets.Dataset.from_dict({"prompt": ["a b", "a b c d e", "a b c", "a b c d"]})
    with pytest.raises(
        JobInputError, match=r"2 of 4 prompts are too long .*longest has 5.*drop_long"
    ):
        _fitting_prompts(_config(), rows, WordFormatter())
    with pytest.warns(UserWarning, match="dropped 2 of 4"):
        kept, dropped = _fitting_prompts(
            _config("dataset.drop_long_prompts=true"), rows, WordFormatter()
        )
    assert dropped == 2 and kept["prompt"] == ["a b", "a b c"]


def _group(reasons: list[str]):
    samples = [
        SimpleNamespace(finish_reason=r, error="prompt has 9 tokens" if r == "error" else None)
        for r in reasons
    ]
    return SimpleNamespace(samples=samples)


def test_error_samples_are_counted_and_left_out() -> None:
    from trainers.trl_adapter.rollout_worker import PoolRolloutWorker

    worker = PoolRolloutWorker(None, [], None, [], None, max_inflight_groups=1)
    assert len(worker._usable(_group(["stop", "length"]))) == 2
    kept = worker._usable(_group(["error", "stop", "stop"]))
    assert [s.finish_reason for s in kept] == ["stop", "stop"]
    assert (worker.good_samples, worker.error_samples) == (4, 1)


def test_a_run_whose_first_samples_all_fail_stops_with_the_error() -> None:
    from trainers.trl_adapter.rollout_worker import PoolRolloutWorker

    worker = PoolRolloutWorker(None, [], None, [], None, max_inflight_groups=1)
    with pytest.raises(
        RuntimeError, match="every rollout sample so far ended in an error.*9 tokens"
    ):
        worker._usable(_group(["error", "error"]))


def test_the_dataset_position_is_the_first_untrained_group() -> None:
    from trainers.trl_adapter.rollout_worker import PoolRolloutWorker

    worker = PoolRolloutWorker(None, [], None, [], None, max_inflight_groups=1, start_cursor=10)
    assert worker.dataset_position(set()) == 10
    assert worker.dataset_position({0, 1, 2, 4}) == 13  # group 3 is still in flight


def test_yaml_numbers_without_a_dot_are_numbers() -> None:
    from trainers.job.config_loading import load_config

    config = load_config(None, ["trainer.learning_rate=1e-5"])
    assert config.trainer.learning_rate == 1e-5
    with pytest.raises(ValueError, match="^trainer.learning_rate=fast: must be a finite number$"):
        load_config(None, ["trainer.learning_rate=fast"])


def test_a_ray_address_with_no_ray_is_one_line_naming_it(monkeypatch) -> None:
    """`--plan` (or the job) with ray_address set where no Ray runs: a JobInputError naming the
    setting and what to do, not Ray's traceback."""
    import ray

    from trainers.job.config_loading import load_config
    from trainers.job.preflight import JobInputError
    from trainers.job.run import plan_job

    def no_ray(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = load_config(None, ["ray_address=auto"])
    with pytest.raises(
        JobInputError, match=r"ray_address=auto: no running Ray found there.*ray start"
    ):
        plan_job(config)


def test_a_ray_address_where_nothing_answers_fails_in_seconds(monkeypatch) -> None:
    """An explicit host:port with nothing listening: Ray would retry it for minutes; the job
    asks first and names the setting (no mock of Ray: this is the real path)."""
    import socket
    import time

    import ray

    from trainers.job.config_loading import load_config
    from trainers.job.preflight import JobInputError
    from trainers.job.run import plan_job

    with socket.socket() as unused:  # a port that was free a moment ago: nothing listens
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = load_config(None, [f"ray_address=127.0.0.1:{port}"])
    began = time.monotonic()
    with pytest.raises(JobInputError, match=rf"ray_address=127.0.0.1:{port}: nothing answers"):
        plan_job(config)
    assert time.monotonic() - began < 15
    assert not ray.is_initialized()


def test_the_ray_address_probe() -> None:
    import socket

    from trainers.job.seats_on_ray import ray_address_answers

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert ray_address_answers(f"127.0.0.1:{port}") is None
        assert ray_address_answers(f"ray://127.0.0.1:{port}") is None
    assert ray_address_answers(f"127.0.0.1:{port}", timeout_s=1.0) is not None
    assert ray_address_answers("auto") is None  # Ray's own to resolve
    assert ray_address_answers("local") is None
    assert ray_address_answers(f"http://127.0.0.1:{port}") is None  # a dashboard's: Ray's to say
