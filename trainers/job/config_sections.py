"""`dataset.*`, `rollout.*`, `environment.*` and `wandb.*` of the job's configuration (config.py;
`trainer.*` is config_trainer.py). Each field documented; every value checked when built
(config_checks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainers.job.config_checks import (
    at_least,
    check_engine,
    check_types,
    not_empty,
    one_of,
    refuse,
)


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
        check_types(self, "dataset.")
        not_empty("dataset.source", self.source)
        at_least("dataset.num_examples", self.num_examples, 1, " (null: all rows)")


@dataclass(frozen=True)
class PlannedLengths:
    """`rollout.planned_lengths.*`, benchmark mode: random weights rarely end a sample, so each
    sample's length is drawn in advance from a lognormal, clipped and rounded; the samples
    ignore EOS and end there."""

    median: float
    """The lognormal's median, in tokens."""
    sigma: float
    """The lognormal's sigma (0: every sample at the median)."""
    min: int
    max: int
    """The draws are clipped to [min, max] (max at most trainer.max_completion_length)."""
    seed: int = 0

    def __post_init__(self) -> None:
        k = "rollout.planned_lengths."
        check_types(self, k)
        if not self.median > 0:
            refuse(k + "median", self.median, "must be > 0 (tokens)")
        at_least(k + "sigma", self.sigma, 0)
        at_least(k + "min", self.min, 1)
        if self.max < self.min:
            refuse(k + "max", self.max, f"must be >= rollout.planned_lengths.min={self.min}")


@dataclass(frozen=True)
class RolloutConfig:
    num_actors: int = 0
    """Ray rollout actors; 0 = one per GPU the trainer does not use (on a cluster without GPUs:
    1)."""
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
    planned_lengths: PlannedLengths | None = None
    """Benchmark mode: each sample's length drawn in advance (rollout.planned_lengths.median=2048
    with sigma, min and max). None: the model ends its samples."""
    layout: str = "auto"
    """Where the trainer and the actors sit on the GPUs. "shared": one GPU holds the trainer (one
    rank) and one actor, weights over CUDA IPC (auto's choice on a one-GPU cluster); "split":
    trainer ranks on GPUs of their own, actors on the others, weights over NCCL (auto's choice
    with 2+ GPUs); "colocated": every trainer GPU also holds an actor (each rank syncs its own
    GPU's actor over CUDA IPC). On a cluster without GPUs every layout is the CPU layout."""

    def __post_init__(self) -> None:
        check_types(self, "rollout.")
        at_least("rollout.num_actors", self.num_actors, 0, " (0: auto)")
        at_least("rollout.cpus_per_actor", self.cpus_per_actor, 0)
        if round(self.cpus_per_actor, 4) != self.cpus_per_actor:
            refuse("rollout.cpus_per_actor", self.cpus_per_actor, "Ray takes at most 4 decimals")
        check_engine(self.engine)
        one_of(
            "rollout.weight_sync_backend",
            self.weight_sync_backend,
            ("auto", "gloo", "nccl", "cuda_ipc"),
        )
        one_of("rollout.layout", self.layout, ("auto", "shared", "split", "colocated"))


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
        check_types(self, k)
        if self.name is not None:
            target, colon, attribute = self.name.rpartition(":")
            if not (colon and target and attribute):
                refuse(k + "name", self.name, "give 'package.module:Class' or 'file.py:Class'")
        at_least(k + "max_turns", self.max_turns, 1)
        if not self.tool_timeout_s > 0:
            refuse(k + "tool_timeout_s", self.tool_timeout_s, "must be > 0 (seconds)")
        at_least(k + "max_turn_tokens", self.max_turn_tokens, 1, " or null")


@dataclass(frozen=True)
class WandbConfig:
    mode: str = "offline"
    """"offline" (no account needed), "online", or "disabled"."""
    project: str = "rollout-grpo"
    """The W&B project the runs are logged to."""

    def __post_init__(self) -> None:
        check_types(self, "wandb.")
        one_of("wandb.mode", self.mode, ("offline", "online", "disabled"))
        not_empty("wandb.project", self.project)
