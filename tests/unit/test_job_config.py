"""The GRPO job's config: defaults, YAML + overrides, and errors that name the key."""

from __future__ import annotations

import pytest

from trainers.config import JobConfig, load_config


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
    config = load_config(None, ["trainer.prompts_per_step=2", "trainer.num_generations=4"])
    assert config.token_budget == 2 * (4 * config.trainer.max_completion_length + 128)
    assert load_config(None, ["trainer.token_budget=999"]).token_budget == 999


def test_shipped_configs_parse() -> None:
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))
    assert files, "configs/ holds the recipes"
    for path in files:
        load_config(str(path), [])
    assert load_config(str(files[0].parent / "default.yaml"), []) == JobConfig(
        output_dir="runs/default"
    )
