"""The GRPO job's config: defaults, YAML + overrides, and errors that name the key."""

from __future__ import annotations

import pytest

from trainers.job.config import JobConfig, load_config


def test_defaults_are_the_cpu_demo() -> None:
    config = load_config(None, [])
    assert config == JobConfig()
    assert config.model == "smollm2" and config.dataset.source == "arithmetic"
    assert config.trainer.mode == "streaming" and config.wandb.mode == "offline"


def test_yaml_then_overrides(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("output_dir: out\ntrainer:\n  max_steps: 7\n  learning_rate: 1.0e-5\n")
    config = load_config(
        str(path), ["trainer.max_steps=3", "rollout.num_actors=2", "rewards=[exact_answer]"]
    )
    assert config.output_dir == "out"
    assert config.trainer.max_steps == 3 and config.trainer.learning_rate == 1e-5
    assert config.rollout.num_actors == 2 and config.rewards == ("exact_answer",)


def test_rows_too_short_to_share_a_prompt_hold_one_sample_each() -> None:
    base = ["trainer.prompts_per_step=2", "trainer.num_generations=4"]
    base += ["trainer.max_completion_length=32", "rollout.engine.max_model_len=160"]
    assert load_config(None, [*base, "trainer.token_budget=160"]).gradient_accumulation_steps == 8
    # Room for 128 + 32 + 2 x 33: three samples of a group per row, the fourth starts a row
    # that the next group's first sample cannot join (it brings its own prompt).
    three = load_config(None, [*base, "trainer.token_budget=226"])
    assert three.gradient_accumulation_steps == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.max_stepz=3"], "trainer.max_stepz"),
        (["outputdir=x"], "outputdir"),
        (["trainer.mode=fast"], "trainer.mode"),
        (["trainer.num_generations=1"], "num_generations"),
        (["wandb.mode=cloud"], "wandb.mode"),
        (["trainer=3"], "trainer must be a mapping"),
        (["max_steps"], "key=value"),
    ],
)
def test_bad_config_errors_name_the_key(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_token_budget_follows_the_step_size() -> None:
    config = load_config(None, ["trainer.prompts_per_step=4", "trainer.num_generations=4"])
    completion = config.trainer.max_completion_length
    assert config.token_budget == 4 * (128 + completion + 3 * (completion + 1))
    assert config.gradient_accumulation_steps == 1 and config.sync_micro_batch == 16
    # A small step still gets a row long enough for the longest sample an actor can return.
    small = load_config(None, ["trainer.prompts_per_step=1", "rollout.engine.max_model_len=2048"])
    assert small.token_budget == 2048


def test_a_token_budget_splits_the_step_into_forwards() -> None:
    base = ["trainer.prompts_per_step=16", "trainer.num_generations=8"]
    base += ["trainer.max_completion_length=4096", "rollout.engine.max_model_len=4352"]
    config = load_config(None, [*base, "trainer.token_budget=34816"])
    assert config.token_budget == 34816
    # 8 samples of a group share a row (128 + 4096 + 7 x 4097 <= 34816), a ninth does not fit.
    assert config.gradient_accumulation_steps == 16
    assert config.sync_micro_batch == 8  # 34816 // 4352 samples per padded forward
    fixed = load_config(None, [*base, "trainer.gradient_accumulation_steps=32"])
    assert fixed.gradient_accumulation_steps == 32 and fixed.sync_micro_batch == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.token_budget=999"], "below rollout.engine.max_model_len=1024"),
        (["trainer.gradient_accumulation_steps=0"], "gradient_accumulation_steps must be >= 1"),
        (["trainer.mode=sync", "trainer.gradient_accumulation_steps=3"], "must divide"),
    ],
)
def test_bad_micro_batching_is_refused(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_shipped_configs_parse() -> None:
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))
    assert files, "configs/ holds the recipes"
    for path in files:
        load_config(str(path), [])
    assert load_config(str(files[0].parent / "default.yaml"), []) == JobConfig(
        output_dir="runs/default"
    )


def test_the_environment_reward_needs_an_environment() -> None:
    with pytest.raises(ValueError, match="environment.name is not set"):
        load_config(None, ["rewards=[environment]"])
    config = load_config(
        None,
        [
            "rewards=[environment]",
            "environment.name=rollout.environments.calculator:CalculatorEnv",
            "environment.max_turns=2",
            "trainer.max_completion_length=96",
        ],
    )
    limits = config.episode_limits()
    assert (limits.max_turns, limits.max_tokens) == (2, 96)
    with pytest.raises(ValueError, match="max_turns and max_turn_tokens must be >= 1"):
        load_config(None, ["environment.max_turn_tokens=0"])


@pytest.mark.parametrize("value", ["nan", ".nan", ".inf", "abc", "true", "[0]"])
def test_reward_nan_value_must_be_a_finite_number(value) -> None:
    with pytest.raises(ValueError, match="reward_nan_value must be a"):
        load_config(None, [f"reward_nan_value={value}"])


def test_reward_nan_value_defaults_to_an_error_and_takes_a_number() -> None:
    assert load_config(None, []).reward_nan_value is None
    assert load_config(None, ["reward_nan_value=0"]).reward_nan_value == 0
    assert load_config(None, ["reward_nan_value=-1.5"]).reward_nan_value == -1.5
