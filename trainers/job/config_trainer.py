"""`trainer.*` of the job's configuration (config.py): the optimizer, the step's size, the loss's
corrections, the checkpoints, and LoRA (`trainer.lora.*`). Each field documented; every value
checked when built (config_checks.py)."""

from __future__ import annotations

from dataclasses import dataclass

from trainers.job.config_checks import at_least, check_lora_targets, check_types, one_of, refuse

STALENESS_RULES = ("last_token", "group_last_token", "mean_token", "first_token")
"""The choices of `trainer.staleness` (trainers/trl_adapter/staleness.py reads them)."""
OFF_POLICY_CORRECTIONS = ("auto", "none", "token_tis", "sequence_mis")
"""The choices of `trainer.off_policy_correction` (trainers/trl_adapter/off_policy.py)."""


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
