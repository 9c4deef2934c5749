"""One trainer process's part of the job, the same wherever it runs: in the job's own process
(one rank on a Ray started here, the laptop default) or in each trainer rank on the cluster
(trainer_ranks.py).

Rank 0 owns the rollout side: it starts the RolloutPool (its actors in the seats the placement
gave them), feeds the trainer, syncs the weights, writes the rollout state into checkpoints, the
final model and summary.json. Every rank builds the same TRL trainer and trains; under FSDP2
their collectives keep them in step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.engine.config import EngineConfig
from rollout.prompts import PromptFormatter
from trainers.job.checkpoints import checkpoints, rollout_state_callback
from trainers.job.config import JobConfig
from trainers.job.console import (
    ActorDeaths,
    console_callback,
    plot_training,
    quiet_default_printing,
)
from trainers.job.placement import Placement
from trainers.job.summary import job_summary
from trainers.trl_adapter import JobInputs, attach_rollout_logging, build_trainer


@dataclass
class Run:
    """What every rank is given: the checked config and inputs, the placement, the resume."""

    config: JobConfig
    inputs: Any
    """preflight.CheckedInputs; None: the process checks them itself (a trainer rank: the
    reward functions and the dataset are loaded where they run, not shipped)."""
    out: Path
    placement: Placement
    saved: dict
    """The rollout state of the checkpoint resumed from ({}: a fresh start)."""
    resume: Path | None
    actor_options: Callable[[int], dict] | None = None
    """Ray options of each rollout actor (its placement-group seat); None: Ray picks."""


def train_process(run: Run, stop, rank: int = 0, world: int = 1) -> dict | None:
    """Train; rank 0 returns the job's summary (other ranks None). `stop` is a GracefulStop (or
    anything with `requested` and `callback(save)`)."""
    import torch

    config, placement = run.config, run.placement
    main = rank == 0
    if placement.trainer_memory_fraction is not None and torch.cuda.is_available():
        # Sharing the GPU with an actor: beyond its share the trainer gets an out-of-memory
        # error instead of starving the actor's KV cache.
        torch.cuda.set_per_process_memory_fraction(placement.trainer_memory_fraction, 0)
    if run.inputs is None:
        from trainers.job.preflight import check_inputs

        run.inputs = check_inputs(config)
    pool = _start_pool(run) if main else None
    built = None
    try:
        deaths = None
        if pool is not None:
            deaths = ActorDeaths(pool, lambda: built.trainer.state.global_step if built else 0)
        inputs = run.inputs
        built = build_trainer(
            JobInputs(
                config=config,
                out=run.out,
                model_path=inputs.model_path,
                tokenizer=inputs.tokenizer,
                dataset=inputs.dataset,
                reward_funcs=inputs.reward_funcs,
                formatter=PromptFormatter(inputs.tokenizer),
                pool=pool,
                weight_sync_backend=placement.weight_sync_backend,
                on_cpu=placement.trainer_device == "cpu",
                start_cursor=run.saved.get("dataset_position") or 0,
                num_processes=world,
                each_rank_syncs_its_actor=placement.each_rank_syncs_its_actor,
            )
        )
        saver = attach_callbacks(built, pool, config, stop, world)
        if main:  # the first step line comes only after a whole step: say what is happening
            t = config.trainer
            print(
                f"[train_grpo] training to step {t.max_steps}; a step's line follows once "
                f"its {t.prompts_per_step} prompt group(s) of {t.num_generations} samples are "
                "generated and trained",
                flush=True,
            )
        seconds = train(built.trainer, config, run.resume)
        final_model = save_final_model(built.trainer, inputs, run.out, config)
        if not main:
            return None
        summary = job_summary(config, built, pool.actor_metrics(), seconds, placement, run.out)
        summary.update(
            actors_at_end=placement.num_actors - len(pool.dead),
            actor_deaths=deaths.summary(),
            final_model=str(final_model),
            checkpoints=[str(c) for c in checkpoints(run.out)],
            checkpoint_saves=[
                {"step": step, "seconds": seconds, "gib": gib} for step, seconds, gib in saver.saves
            ],
            resumed_from=str(run.resume) if run.resume else None,
            dataset_position_at_start=run.saved.get("dataset_position") or 0,
            stopped_by=stop.requested,
            dropped_prompts=inputs.dropped_prompts,
            plot=str(plot_training(built.trainer.state.log_history, run.out / "training.png")),
        )
        (run.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return summary
    finally:
        if built is not None and built.worker is not None:
            built.worker.stop()
        if main:
            _finish_wandb()
        if pool is not None:
            pool.shutdown()


def _start_pool(run: Run):
    from rollout.actors.pool import RolloutPool

    config, placement = run.config, run.placement
    settings = placement.engine_settings(config.rollout.engine)
    settings |= config.engine_settings_for_trainer
    engine = EngineConfig(model=run.inputs.model_path, seed=config.seed, **settings)
    pool = RolloutPool(
        engine,
        placement.num_actors,
        num_gpus_per_actor=placement.gpus_per_actor,
        num_cpus_per_actor=config.rollout.cpus_per_actor,
        actor_options=run.actor_options,
    )
    # A resumed run continues the weight versions, so staleness is counted as before.
    pool.version = run.saved.get("model_version", 0)
    return pool


def attach_callbacks(built, pool, config: JobConfig, stop, world: int = 1):
    """The rollout side's metrics in every log, one console line per step instead of
    transformers' dicts, the stop on a signal (agreed by every rank), and the rollout state in
    every checkpoint; returns the last, whose `saves` time each checkpoint (rank 0's)."""
    trainer = built.trainer
    if pool is not None:
        attach_rollout_logging(trainer, pool, built.transfer)
    quiet_default_printing(trainer)
    if pool is not None:
        trainer.add_callback(console_callback(config.trainer.max_steps))
    trainer.add_callback(stop.callback(save=config.save_steps > 0, every_rank=world > 1))
    saver = rollout_state_callback(
        lambda: {
            "dataset_position": built.dataset_position(),
            "model_version": pool.version,
            "wandb_run_id": os.environ.get("WANDB_RUN_ID"),
        },
        writer=pool is not None,
    )
    trainer.add_callback(saver)
    return saver


def save_final_model(trainer, inputs, out: Path, config: JobConfig) -> Path:
    """The trained model and its tokenizer, in Hugging Face format, at <output_dir>/final_model:
    loadable by transformers and by LLMEngine(EngineConfig(model=...)). Sharded: gathered whole
    onto rank 0's CPU (every rank takes part), which writes it. LoRA: the adapter in
    final_model/adapter, and the base model with it merged in final_model/."""
    folder = out / "final_model"
    lora = config.trainer.lora
    target = folder / "adapter" if lora is not None else folder
    main = trainer.accelerator.is_main_process
    if getattr(trainer, "is_fsdp_enabled", False):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        model = trainer.accelerator.unwrap_model(trainer.model)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)  # a collective on every rank
        if main:
            model.save_pretrained(str(target), state_dict=state)
    else:
        trainer.save_model(str(target))
    if main:
        if lora is not None:
            from trainers.trl_adapter.lora import save_merged_model

            save_merged_model(target, inputs.model_path, folder, config.trainer.dtype)
        inputs.tokenizer.save_pretrained(str(folder))
    trainer.accelerator.wait_for_everyone()
    return folder


def train(trainer, config: JobConfig, resume: Path | None) -> float:
    """Run the trainer (from `resume` when given); returns the seconds it took."""
    import time

    import torch

    start = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except torch.OutOfMemoryError as err:
        raise RuntimeError(
            f"the trainer ran out of GPU memory with trainer.token_budget={config.token_budget} "
            f"({trainer.args.gradient_accumulation_steps} forwards per step). Lower "
            "trainer.token_budget (it must stay >= rollout.engine.max_model_len), turn on "
            "trainer.gradient_checkpointing, add trainer.num_processes, or train a LoRA "
            "adapter (trainer.lora.r=16)"
        ) from err
    return time.perf_counter() - start


def _finish_wandb() -> None:
    """Close the W&B run TRL opened, so its files are complete and a next job starts its own."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()  # its settings (the run directory) are cached per process otherwise
