"""The GRPO job's config: defaults, YAML + overrides, and errors that name the key."""

from __future__ import annotations

import dataclasses
import os
import typing

import pytest

from rollout.engine.config import EngineConfig
from trainers.job.config import JobConfig
from trainers.job.config_loading import load_config


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


def test_fp8_rollouts_turn_the_off_policy_correction_on_and_the_job_says_so() -> None:
    from trainers.job.run import fp8_notice

    assert load_config(None, []).off_policy_correction == "none"
    fp8 = load_config(None, ["rollout.engine.weight_quantization=fp8"])
    assert fp8.fp8_rollouts and fp8.off_policy_correction == "token_tis"
    assert "token_tis (auto, cap 2.0) corrects" in fp8_notice(fp8)
    chosen = load_config(
        None,
        ["rollout.engine.weight_quantization=fp8", "trainer.off_policy_correction=sequence_mis"],
    )
    assert chosen.off_policy_correction == "sequence_mis" and "(as set" in fp8_notice(chosen)
    off = load_config(
        None, ["rollout.engine.weight_quantization=fp8", "trainer.off_policy_correction=none"]
    )
    assert off.off_policy_correction == "none" and "does not correct" in fp8_notice(off)
    kv = load_config(None, ["rollout.engine.kv_cache_dtype=fp8"])
    assert kv.fp8_rollouts and kv.off_policy_correction == "token_tis"


def test_the_actors_get_what_the_trainer_needs_of_them() -> None:
    from trainers.job.run import fp8_notice

    assert load_config(None, []).engine_settings_for_trainer == {}
    lora_fp8 = load_config(None, ["rollout.engine.weight_quantization=fp8", "trainer.lora.r=8"])
    assert lora_fp8.engine_settings_for_trainer == {"fp8_keep_unrounded": True}
    assert "keep the unrounded base weights" in fp8_notice(lora_fp8)
    assert load_config(None, ["trainer.lora.r=8"]).engine_settings_for_trainer == {}
    kv_only = load_config(None, ["rollout.engine.kv_cache_dtype=fp8", "trainer.lora.r=8"])
    assert kv_only.engine_settings_for_trainer == {}


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
        (["trainer=3"], "trainer=3: must be a mapping"),
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
        (["trainer.gradient_accumulation_steps=0"], "gradient_accumulation_steps=0: must be >= 1"),
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
    with pytest.raises(ValueError, match="environment.max_turn_tokens=0: must be >= 1"):
        load_config(None, ["environment.max_turn_tokens=0"])


# ---- every value checked when the config is built: one line naming the key --------------------


def _refusal(overrides: list[str], path: str | None = None) -> str:
    from trainers.job.config_checks import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # The cases: each failed after Ray had started, or with a traceback.
        (
            "trainer.learning_rate=-1",
            "trainer.learning_rate=-1: must be > 0 (GPU recipes use ~1e-6)",
        ),
        ("trainer.temperature=-1", "trainer.temperature=-1: must be > 0 (0.7-1.0 are usual)"),
        ("trainer.max_steps=abc", "trainer.max_steps=abc: must be a whole number"),
        # Ranges.
        ("trainer.learning_rate=0", "trainer.learning_rate=0: must be > 0"),
        ("trainer.max_steps=0", "trainer.max_steps=0: must be >= 1"),
        ("trainer.num_generations=1", "trainer.num_generations=1: must be >= 2: GRPO's advantages"),
        ("trainer.prompts_per_step=0", "trainer.prompts_per_step=0: must be >= 1"),
        ("trainer.max_completion_length=0", "trainer.max_completion_length=0: must be >= 1"),
        ("trainer.max_staleness=-1", "trainer.max_staleness=-1: must be >= 0"),
        ("trainer.weight_sync_steps=0", "trainer.weight_sync_steps=0: must be >= 1"),
        ("trainer.token_budget=0", "trainer.token_budget=0: must be >= 1"),
        ("trainer.logging_steps=0", "trainer.logging_steps=0: must be >= 1"),
        ("trainer.save_steps=-1", "trainer.save_steps=-1: must be >= 0 (0: no checkpoints"),
        ("trainer.save_total_limit=0", "trainer.save_total_limit=0: must be >= 1 or null"),
        ("trainer.dtype=fp32", "trainer.dtype=fp32: must be float32, bfloat16 or float16"),
        ("rollout.num_actors=-1", "rollout.num_actors=-1: must be >= 0"),
        ("rollout.cpus_per_actor=-0.5", "rollout.cpus_per_actor=-0.5: must be >= 0"),
        ("rollout.cpus_per_actor=0.00001", "rollout.cpus_per_actor=1e-05: Ray takes at most 4"),
        ("rollout.weight_sync_backend=mpi", "rollout.weight_sync_backend=mpi: must be auto,"),
        ("dataset.num_examples=0", "dataset.num_examples=0: must be >= 1 (null: all rows)"),
        ("dataset.source=''", "dataset.source='': must not be empty"),
        ("environment.max_turns=0", "environment.max_turns=0: must be >= 1"),
        ("environment.tool_timeout_s=0", "environment.tool_timeout_s=0: must be > 0"),
        ("environment.name=calc", "environment.name=calc: give 'package.module:Class' or"),
        ("wandb.project=''", "wandb.project='': must not be empty"),
        ("seed=-1", "seed=-1: must be between 0 and 2**32 - 1"),
        ("seed=4294967296", "seed=4294967296: must be between 0 and 2**32 - 1"),
        ("model=''", "model='': must not be empty"),
        ("output_dir=", "output_dir=null: must be a string"),
        ("rewards=[]", "rewards=[]: give at least one reward function"),
        ("rewards=3", "rewards=3: must be a list of strings"),
        ("reward_weights=0.5", "reward_weights=0.5: must be a list of finite numbers or null"),
        ("reward_weights=[1, 2, 3]", "reward_weights=[1, 2, 3]: 3 weights for 2 rewards"),
        # Types of every kind.
        ("trainer.learning_rate=[1]", "trainer.learning_rate=[1]: must be a finite number"),
        ("trainer.learning_rate=.nan", "trainer.learning_rate=nan: must be a finite number"),
        ("trainer.max_steps=2.5", "trainer.max_steps=2.5: must be a whole number"),
        ("trainer.max_steps=true", "trainer.max_steps=true: must be a whole number"),
        (
            "trainer.gradient_checkpointing=maybe",
            "trainer.gradient_checkpointing=maybe: must be true",
        ),
        ("trainer.mode=[streaming]", "trainer.mode=[streaming]: must be a string"),
        ("rollout.engine=3", "rollout.engine=3: must be a mapping"),
        ("model.path=x", "model={path: x}: is a single value, not a section"),
    ],
)
def test_every_bad_value_is_one_line_naming_its_key(override, message) -> None:
    assert _refusal([override]).startswith(message)


def test_a_greedy_temperature_is_refused_with_the_reason() -> None:
    message = _refusal(["trainer.temperature=0"])
    assert message.startswith("trainer.temperature=0: must be > 0: at 0 (greedy)")
    assert "all equal" in message


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.engine.max_model_len=-1", "rollout.engine.max_model_len=-1: must be a positive"),
        ("rollout.engine.max_model_len=abc", "rollout.engine.max_model_len=abc: must be a whole"),
        ("rollout.engine.gpu_memory_utilization=2", "engine.gpu_memory_utilization=2: must be in"),
        ("rollout.engine.gpu_memory_utilization=x", "engine.gpu_memory_utilization=x: must be a"),
        ("rollout.engine.overlap=maybe", "rollout.engine.overlap=maybe: must be true or false"),
        ("rollout.engine.dtype=fp8", "rollout.engine.dtype=fp8: must be one of"),
        (
            "rollout.engine.weight_quantization=int4",
            "rollout.engine.weight_quantization=int4: must be one of",
        ),
        ("rollout.engine.model=/m", "rollout.engine.model=/m: the job sets it from the top-level"),
        ("rollout.engine.seed=3", "rollout.engine.seed=3: the job sets it from the top-level"),
        ("rollout.engine.max_len=8", "unknown config key(s) ['rollout.engine.max_len']"),
    ],
)
def test_engine_errors_name_the_jobs_key(override, message) -> None:
    """EngineConfig's own checks, reported under the key the user wrote."""
    assert message in _refusal([override])


def _leaf_fields(cls, prefix: str = ""):
    """(dotted key, annotation) of every value field under a config dataclass, sections opened
    (the optional ones too, such as trainer.lora)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
        sections = [kind for kind in kinds if dataclasses.is_dataclass(kind)]
        if sections:
            yield from _leaf_fields(sections[0], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, str(f.type)


_ENGINE_FIELDS = [(f"rollout.engine.{key}", kind) for key, kind in _leaf_fields(EngineConfig)]
_ALL_FIELDS = list(_leaf_fields(JobConfig)) + [
    (key, kind)
    for key, kind in _ENGINE_FIELDS
    if key not in ("rollout.engine.model", "rollout.engine.seed")
]
# A wrong value for each kind of field: not a number, not a bool, not a string.
_WRONG = {"int": "abc", "float": "[1, 2]", "bool": "maybe", "str": "[a, b]"}
# What turns each optional section on, so that a wrong value inside it is what gets refused.
_SECTION_ON = {
    "trainer.lora.": ["trainer.lora.r=8"],
    "rollout.planned_lengths.": [
        "rollout.planned_lengths={median: 8, sigma: 1.0, min: 2, max: 16}"
    ],
}


def _turned_on(key: str) -> list[str]:
    return next((on for prefix, on in _SECTION_ON.items() if key.startswith(prefix)), [])


def _optional_sections(cls, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
        for kind in [k for k in kinds if dataclasses.is_dataclass(k)]:
            if type(None) in kinds:
                yield f"{prefix}{f.name}."
            yield from _optional_sections(kind, f"{prefix}{f.name}.")


def test_every_optional_section_is_turned_on_above() -> None:
    assert set(_optional_sections(JobConfig)) == set(_SECTION_ON)


@pytest.mark.parametrize(("key", "kind"), _ALL_FIELDS, ids=[key for key, _ in _ALL_FIELDS])
def test_every_field_refuses_a_value_of_the_wrong_kind(key, kind) -> None:
    """Driven by the dataclasses' fields: a new field cannot skip the type checks."""
    base = kind.replace(" | None", "")
    if base not in _WRONG:  # rewards, reward_weights, rollout.engine, lora targets: own cases
        assert base in ("tuple[str, ...]", "tuple[float, ...]", "dict", "tuple[str, ...] | str")
        return
    message = _refusal([*_turned_on(key), f"{key}={_WRONG[base]}"])
    assert message.startswith(f"{key}="), message
    assert ": must be " in message


def test_every_numeric_field_refuses_a_non_number() -> None:
    numeric = [key for key, kind in _ALL_FIELDS if kind.split(" |")[0] in ("int", "float")]
    assert "trainer.learning_rate" in numeric and "rollout.engine.max_model_len" in numeric
    for key in numeric:
        for value in ("abc", "[1]", "{a: 1}", "true"):
            message = _refusal([*_turned_on(key), f"{key}={value}"])
            assert message.startswith(f"{key}="), message


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("output_dir: out\ntrainer:\n  max_steps: 3\n  learning_rate: [1e-6\n")
    message = _refusal([], str(path))
    assert message.startswith(f"{path}:5:1: not valid YAML: ")
    path.write_text("trainer:\n  max_steps: 3\n    temperature: 0.7\n")
    assert _refusal([], str(path)).startswith(f"{path}:3:16: not valid YAML: mapping values")


def test_a_config_file_that_is_missing_or_not_a_mapping(tmp_path) -> None:
    assert (
        _refusal([], str(tmp_path / "nope.yaml"))
        == f"--config {tmp_path / 'nope.yaml'}: no such file"
    )
    assert _refusal([], str(tmp_path)).startswith(f"--config {tmp_path}: is a folder")
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    assert _refusal([], str(path)) == f"{path}: the top level must be a mapping of keys"
    path.write_text("trainer:\n  max_steps: abc\n")
    assert _refusal([], str(path)) == "trainer.max_steps=abc: must be a whole number"


def test_an_override_that_is_not_yaml_names_the_override() -> None:
    message = _refusal(["trainer.max_steps=["])
    assert message.startswith("override 'trainer.max_steps=[': the value is not valid YAML (")
    assert _refusal(["trainer..max_steps=3"]).startswith("override 'trainer..max_steps=3' must")


def test_an_override_below_a_value_names_it(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("model: smollm2\n")
    message = _refusal(["model.path=x"], str(path))
    assert message == "override 'model.path=x': model is a value, not a section with keys"


def test_an_empty_section_in_the_file_is_the_defaults(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("trainer:\nrollout:\n  engine: {max_model_len: 512}\n")
    config = load_config(str(path), ["trainer.max_steps=3"])
    assert config.trainer.max_steps == 3 and config.max_sample_tokens == 512


def test_the_config_classes_check_when_built_directly() -> None:
    from trainers.job.config_checks import ConfigError
    from trainers.job.config_sections import RolloutConfig
    from trainers.job.config_trainer import TrainerConfig

    with pytest.raises(ConfigError, match=r"^trainer.learning_rate=-1: must be > 0"):
        TrainerConfig(learning_rate=-1)
    with pytest.raises(ConfigError, match=r"^rollout.engine.block_size=0: must be a positive"):
        RolloutConfig(engine={"block_size": 0})
    with pytest.raises(ConfigError, match=r"^trainer=\{max_steps: 3\}: must be a TrainerConfig$"):
        JobConfig(trainer={"max_steps": 3})
    assert JobConfig(rewards=["exact_answer"], reward_weights=[2]).reward_weights == (2,)


def test_the_script_refuses_a_bad_value_in_one_line_in_seconds(tmp_path) -> None:
    """The whole path, as a user runs it: exit 2, one stderr line naming the key, no Ray."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: [3\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    cases = {
        "trainer.learning_rate=-1": ["trainer.learning_rate=-1"],
        "trainer.temperature=0": ["trainer.temperature=0"],
        "trainer.max_steps=abc": ["trainer.max_steps=abc"],
        "override 'trainer.max_steps=['": ["trainer.max_steps=["],
        f"{bad}:3:1": ["--config", str(bad)],
        f"output_dir={a_file}": [f"output_dir={a_file}"],
    }
    for named, argv in cases.items():
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(root / "scripts" / "train_grpo.py"), *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        seconds = time.perf_counter() - start
        assert done.returncode == 2, (argv, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"train_grpo.py: error: {named}"), lines
        assert seconds < 20, (argv, seconds)  # Ray alone takes longer to start
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_dir_that_is_a_file_stops_the_job_before_any_work(
    tmp_path, monkeypatch, below
) -> None:
    from trainers.job import run
    from trainers.job.preflight import JobInputError

    def too_far(*args, **kwargs):
        raise AssertionError("the job went on past prepare_run_directory")

    monkeypatch.setattr(run, "check_inputs", too_far)
    monkeypatch.setattr(run, "ray_session", too_far)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    output_dir = str(a_file / below) if below else str(a_file)
    config = load_config(None, [f"output_dir={output_dir}"])
    with pytest.raises(JobInputError) as caught:
        run.run_job(config)
    assert str(caught.value) == (
        f"output_dir={output_dir}: {a_file} is a file, not a folder; choose another output_dir"
    )


def test_an_environment_that_cannot_be_loaded_is_named_before_ray(tmp_path) -> None:
    from trainers.job.preflight import JobInputError, _environment

    _environment(load_config(None, []))  # none configured: nothing to load
    _environment(
        load_config(None, ["environment.name=rollout.environments.calculator:CalculatorEnv"])
    )
    missing = tmp_path / "envs.py"
    config = load_config(None, [f"environment.name={missing}:Env"])
    with pytest.raises(JobInputError, match=rf"^environment.name={missing}:Env: .*not found"):
        _environment(config)


@pytest.mark.parametrize("value", ["nan", ".nan", ".inf", "abc", "true", "[0]"])
def test_reward_nan_value_must_be_a_finite_number(value) -> None:
    with pytest.raises(ValueError, match="^reward_nan_value="):
        load_config(None, [f"reward_nan_value={value}"])


def test_reward_nan_value_defaults_to_an_error_and_takes_a_number() -> None:
    assert load_config(None, []).reward_nan_value is None
    assert load_config(None, ["reward_nan_value=0"]).reward_nan_value == 0
    assert load_config(None, ["reward_nan_value=-1.5"]).reward_nan_value == -1.5


# ---- trainer ranks, LoRA and the rollout layout ---------------------------------------------


def test_lora_is_off_by_default_and_r_alone_turns_it_on() -> None:
    assert load_config(None, []).trainer.lora is None
    lora = load_config(None, ["trainer.lora.r=8"]).trainer.lora
    assert (lora.r, lora.alpha, lora.dropout, lora.target_modules) == (8, None, 0.0, "all-linear")
    assert lora.effective_alpha == 16
    off = load_config(None, ["trainer.lora.r=8", "trainer.lora=null"])
    assert off.trainer.lora is None


def test_lora_from_a_file_with_a_list_of_targets(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("trainer:\n  lora: {r: 4, alpha: 1.0e+1, target_modules: [q_proj, v_proj]}\n")
    lora = load_config(str(path), ["trainer.lora.dropout=0.05"]).trainer.lora
    assert lora.target_modules == ("q_proj", "v_proj")
    assert (lora.effective_alpha, lora.dropout) == (10, 0.05)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.lora.alpha=16"],
            "trainer.lora.r is required when trainer.lora is given; set it, or trainer.lora=null "
            "to leave the section out",
        ),
        (["trainer.lora={}"], "trainer.lora.r is required when trainer.lora is given"),
        (["trainer.lora=3"], "trainer.lora=3: must be a mapping (e.g. trainer.lora.KEY=VALUE)"),
        (["trainer.lora.r=0"], "trainer.lora.r=0: must be >= 1"),
        (["trainer.lora.r=4", "trainer.lora.alpha=0"], "trainer.lora.alpha=0: must be > 0"),
        (["trainer.lora.r=4", "trainer.lora.dropout=1"], "trainer.lora.dropout=1: must be >= 0"),
        (
            ["trainer.lora.r=4", "trainer.lora.target_modules=q_proj"],
            "trainer.lora.target_modules=q_proj: must be all-linear or a list of names like",
        ),
        (
            ["trainer.lora.r=4", "trainer.lora.target_modules=[]"],
            "trainer.lora.target_modules=[]: give at least one module name, or all-linear",
        ),
        (
            ["trainer.lora.r=4", "trainer.lora.target_modules=3"],
            "trainer.lora.target_modules=3: must be a list of strings or a string",
        ),
        (
            ["trainer.lora.r=4", "trainer.lora.target_modules=[q_proj, lm_head]"],
            "trainer.lora.target_modules=[q_proj, lm_head]: lm_head is the output head: TRL's "
            "AsyncGRPO computes logprobs from its base weight and would ignore the adapter",
        ),
        (["trainer.num_processes=0"], "trainer.num_processes=0: must be >= 1"),
        (
            ["trainer.off_policy_correction=tis"],
            "trainer.off_policy_correction=tis: must be auto, none, token_tis or sequence_mis",
        ),
        (["trainer.off_policy_cap=1"], "trainer.off_policy_cap=1: must be > 1 (2.0 is usual)"),
        (
            ["rollout.planned_lengths={median: 20, sigma: 1, min: 4, max: 480}"],
            "rollout.planned_lengths.max=480: above trainer.max_completion_length=48",
        ),
        (
            ["rollout.planned_lengths={median: 20, sigma: 1, min: 9, max: 4}"],
            "rollout.planned_lengths.max=4: must be >= rollout.planned_lengths.min=9",
        ),
        (
            ["rollout.planned_lengths.median=20"],
            "rollout.planned_lengths.sigma is required when rollout.planned_lengths is given",
        ),
        (
            [
                "trainer.routing_replay=true",
                "environment.name=rollout.environments.calculator:CalculatorEnv",
            ],
            "trainer.routing_replay=true: replays single-turn rollouts",
        ),
        (
            ["trainer.routing_replay=true", "rollout.engine={enable_prefix_caching: true}"],
            "rollout.engine.enable_prefix_caching=true: trainer.routing_replay needs the actors' "
            "prefix cache off",
        ),
        (
            ["trainer.staleness=oldest"],
            "trainer.staleness=oldest: must be last_token, group_last_token, mean_token or first_token",
        ),
        (
            ["trainer.num_processes=3", "trainer.mode=sync", "trainer.prompts_per_step=2"],
            "trainer.num_processes=3: must divide the step's ",
        ),
        (
            [
                "trainer.num_processes=2",
                "trainer.mode=sync",
                "trainer.prompts_per_step=2",
                "trainer.num_generations=4",
                "trainer.gradient_accumulation_steps=8",
            ],
            "trainer.gradient_accumulation_steps=8: must divide the step's 4 samples per rank "
            "(2 ranks)",
        ),
        (
            ["rollout.layout=spread"],
            "rollout.layout=spread: must be auto, shared, split or colocated",
        ),
    ],
)
def test_ranks_lora_and_layout_errors_are_one_line(overrides, message) -> None:
    assert _refusal(overrides).startswith(message)


def test_sync_mode_splits_a_step_over_the_ranks() -> None:
    config = load_config(
        None,
        [
            "trainer.mode=sync",
            "trainer.num_processes=2",
            "trainer.prompts_per_step=4",
            "trainer.num_generations=4",
            "trainer.gradient_accumulation_steps=2",
        ],
    )
    assert config.samples_per_rank == 8 and config.sync_micro_batch == 4


def test_several_ranks_and_each_layout_are_accepted() -> None:
    config = load_config(None, ["trainer.num_processes=4", "rollout.layout=colocated"])
    assert (config.trainer.num_processes, config.rollout.layout) == (4, "colocated")
    assert load_config(None, []).rollout.layout == "auto"
    for layout in ("shared", "split"):
        assert load_config(None, [f"rollout.layout={layout}"]).rollout.layout == layout


def test_rollout_actors_default_to_auto_which_is_one_on_cpu() -> None:
    from trainers.job.layouts import plan_placement, this_machine

    rollout = load_config(None, []).rollout
    assert rollout.num_actors == 0
    assert plan_placement(rollout, 1, [this_machine(0)]).num_actors == 1
    assert plan_placement(rollout, 1, [this_machine(4)]).num_actors == 3
