"""What a person watching a run sees: the step's own rollout throughput on the console and in the
plot (one point per step), and a dead rollout actor in the console, the logs and the summary."""

from __future__ import annotations

from types import SimpleNamespace

from rollout.actors.messages import ActorDeath


class _FakePool:
    def __init__(self, num_actors: int) -> None:
        self.actors = dict.fromkeys(range(num_actors))
        self.dead: dict[int, str] = {}
        self.deaths: list[ActorDeath] = []
        self.metrics: dict[int, dict[str, float]] = {}
        self.on_actor_death = None

    def actor_metrics(self) -> dict[int, dict[str, float]]:
        return {a: m for a, m in self.metrics.items() if a not in self.dead}

    def kill(self, actor: int) -> None:
        self.dead[actor] = "RayActorError('killed')"
        death = ActorDeath(actor, 0.0, self.dead[actor], len(self.actors) - len(self.dead))
        self.deaths.append(death)
        if self.on_actor_death is not None:
            self.on_actor_death(death)


def _metrics(total_tokens: float) -> dict[str, float]:
    keys = ("tokens_per_s", "running_sequences", "preemptions")
    return dict.fromkeys(keys, 0.0) | {"total_tokens": total_tokens}


def test_the_step_throughput_counts_the_tokens_since_the_last_step(monkeypatch) -> None:
    from trainers.trl_adapter import rollout_logging

    clock = iter([100.0, 110.0, 130.0, 140.0])
    monkeypatch.setattr(rollout_logging.time, "monotonic", lambda: next(clock))
    throughput = rollout_logging.StepThroughput()  # t = 100
    assert throughput.update({0: _metrics(500), 1: _metrics(300)}) == 80.0  # 800 in 10 s
    # Actor 1 died after the last log: its tokens are not taken back.
    assert throughput.update({0: _metrics(900)}) == 20.0  # 400 in 20 s
    assert throughput.update({0: _metrics(900)}) == 0.0  # a step with nothing finished


def test_the_logs_carry_the_step_throughput_live_actors_and_a_death_once() -> None:
    from trainers.trl_adapter.rollout_logging import attach_rollout_logging

    logged = []
    trainer = SimpleNamespace(log=lambda logs, *a, **k: logged.append(dict(logs)))
    pool = _FakePool(2)
    pool.metrics = {0: _metrics(100), 1: _metrics(100)}
    attach_rollout_logging(trainer, pool, SimpleNamespace(history=[]))
    trainer.log({"loss": 1.0})
    pool.kill(1)
    trainer.log({"loss": 0.9})
    trainer.log({"loss": 0.8})
    trainer.log({"train_runtime": 9.0})
    assert [e["rollout/live_actors"] for e in logged] == [2, 1, 1, 1]
    assert [e.get("rollout/actor_died") for e in logged] == [None, 1, None, None]
    assert all("rollout/step_tokens_per_s" in e for e in logged[:3])
    assert "rollout/step_tokens_per_s" not in logged[3], "the closing log is not a step"


def test_the_console_line_shows_the_step_throughput_not_the_window() -> None:
    from trainers.job.console import step_line

    logs = {"rollout/tokens_per_s": 0.0, "rollout/step_tokens_per_s": 12.4}
    assert "rollout 12 tok/s" in step_line(logs, 3, 8, step_s=40.0)
    assert "rollout 7 tok/s" in step_line({"rollout/tokens_per_s": 7.0}, 3, 8, step_s=40.0)


def test_the_plot_has_one_point_per_step(tmp_path) -> None:
    from trainers.job.console import plot_training, training_rows

    history = [
        {"step": 1, "reward": 0.5, "rollout/step_tokens_per_s": 10.0},
        {"step": 2, "reward": 0.7, "rollout/step_tokens_per_s": 12.0},
        {"step": 2, "train_runtime": 30.0, "rollout/step_tokens_per_s": 99.0},
    ]
    rows = training_rows(history)
    assert [(r["step"], r["rollout/step_tokens_per_s"]) for r in rows] == [(1, 10.0), (2, 12.0)]
    assert plot_training(history, tmp_path / "t.png").is_file()


def test_a_dead_actor_is_a_console_line_and_a_summary_entry(capsys) -> None:
    from trainers.job.console import ActorDeaths

    pool = _FakePool(2)
    deaths = ActorDeaths(pool, current_step=lambda: 5)
    pool.kill(0)
    line = capsys.readouterr().out.strip()
    assert (
        line
        == "[train_grpo] rollout actor 0 died at step 5 (RayActorError('killed')); 1 of 2 actor(s) go on"
    )
    [entry] = deaths.summary()
    assert entry["actor"] == 0 and entry["step"] == 5 and "killed" in entry["error"]


def test_trls_second_step_callback_is_not_a_warning() -> None:
    """AsyncGRPOTrainer adds two StepIntervalCallbacks on purpose; transformers' warning about
    the second is dropped, and its warnings about any other callback still show."""
    import logging

    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler

    from trainers.trl_adapter.streaming import _quiet_second_step_callback

    class StepIntervalCallback(TrainerCallback):  # named as TRL's
        pass

    class OtherCallback(TrainerCallback):
        pass

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    log = logging.getLogger("transformers.trainer_callback")
    handler = Keep()
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.WARNING)  # a trainer built earlier in the run may have quieted the library
    try:
        _quiet_second_step_callback()
        _quiet_second_step_callback()  # once is enough
        handler_list = CallbackHandler([], None, None, None, None)
        for callback in (StepIntervalCallback, StepIntervalCallback, OtherCallback, OtherCallback):
            handler_list.add_callback(callback())
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    added = [r for r in records if r.startswith("You are adding a")]
    assert len(added) == 1 and "OtherCallback'> to the callbacks" in added[0], records
