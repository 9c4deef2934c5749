"""The GRPO job: Ray rollout actors -> RolloutPool -> TRL trainer -> weights back; W&B; summary.

run_job(config)
  prepare_run_directory    the environment defaults, W&B inside the run directory
  plan_placement           where the trainer and the actors run (trainers.job.placement)
  ray_session              join the cluster the job runs in, or start a local Ray
  RolloutPool              the actors, each running an LLMEngine
  build_trainer            the TRL trainer of the configured mode (trainers.trl_adapter)
  train                    trainer.train(), with an out-of-memory error that names the knob
  job_summary              summary.json (trainers.job.summary)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rollout.engine.config import EngineConfig
from rollout.process_env import set_process_env_defaults
from rollout.prompts import PromptFormatter
from trainers.job.checkpoints import (
    checkpoints,
    read_rollout_state,
    rollout_state_callback,
    wandb_run_id,
)
from trainers.job.config import JobConfig
from trainers.job.console import (
    ActorDeaths,
    console_callback,
    plot_training,
    quiet_default_printing,
)
from trainers.job.placement import plan_placement, ray_sees
from trainers.job.preflight import JobInputError, check_inputs
from trainers.job.resume import resolve_resume
from trainers.job.session_reaper import local_session_name, start_session_reaper
from trainers.job.stopping import GracefulStop
from trainers.job.summary import job_summary
from trainers.trl_adapter import JobInputs, attach_rollout_logging, build_trainer


def run_job(config: JobConfig) -> dict:
    out = prepare_run_directory(config)
    # Heavy imports after the environment defaults, which transformers reads at import.
    import torch

    from rollout.actors.pool import RolloutPool

    # Everything the user gave, checked before Ray: a mistake fails in seconds, in one line.
    inputs = check_inputs(config)
    # The checkpoint too: a missing or damaged file stops the run here, not inside the trainer.
    resume = resolve_resume(config.trainer.resume_from_checkpoint, out)
    saved = read_rollout_state(resume)
    os.environ["WANDB_RUN_ID"] = saved.get("wandb_run_id") or wandb_run_id(out)
    os.environ["WANDB_RESUME"] = "allow"
    placement = plan_placement(config.rollout, torch.cuda.device_count())
    if placement.trainer_memory_fraction is not None:
        # Sharing the GPU with an actor: beyond its share the trainer gets an out-of-memory
        # error instead of starving the actor's KV cache.
        torch.cuda.set_per_process_memory_fraction(placement.trainer_memory_fraction, 0)
    stop = GracefulStop()
    # Ray installs its own SIGTERM handler when it starts: ours goes in after it.
    with ray_session(config, placement), stop.installed():
        engine = EngineConfig(
            model=inputs.model_path,
            seed=config.seed,
            **placement.engine_settings(config.rollout.engine),
        )
        print(
            f"[train_grpo] {placement.num_actors} rollout actor(s), trainer on "
            f"{placement.trainer_device}, weight sync over {placement.weight_sync_backend}"
            + (f"; resuming from {resume}" if resume else "")
        )
        pool = RolloutPool(
            engine,
            placement.num_actors,
            num_gpus_per_actor=placement.gpus_per_actor,
            num_cpus_per_actor=config.rollout.cpus_per_actor,
        )
        # A resumed run continues the weight versions, so staleness is counted as before.
        pool.version = saved.get("model_version", 0)
        built = None
        deaths = ActorDeaths(pool, lambda: built.trainer.state.global_step if built else 0)
        try:
            built = build_trainer(
                JobInputs(
                    config=config,
                    out=out,
                    model_path=inputs.model_path,
                    tokenizer=inputs.tokenizer,
                    dataset=inputs.dataset,
                    reward_funcs=inputs.reward_funcs,
                    formatter=PromptFormatter(inputs.tokenizer),
                    pool=pool,
                    weight_sync_backend=placement.weight_sync_backend,
                    on_cpu=placement.trainer_device == "cpu",
                    start_cursor=saved.get("dataset_position") or 0,
                )
            )
            trainer = built.trainer
            saver = attach_callbacks(built, pool, config, stop)
            seconds = train(trainer, config, resume)
            final_model = save_final_model(trainer, inputs.tokenizer, out)
            summary = job_summary(config, built, pool.actor_metrics(), seconds, placement, out)
            summary.update(
                actors_at_end=placement.num_actors - len(pool.dead),
                actor_deaths=deaths.summary(),
                final_model=str(final_model),
                checkpoints=[str(c) for c in checkpoints(out)],
                checkpoint_saves=[
                    {"step": step, "seconds": seconds, "gib": gib}
                    for step, seconds, gib in saver.saves
                ],
                resumed_from=str(resume) if resume else None,
                dataset_position_at_start=saved.get("dataset_position") or 0,
                stopped_by=stop.requested,
                dropped_prompts=inputs.dropped_prompts,
                plot=str(plot_training(trainer.state.log_history, out / "training.png")),
            )
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            return summary
        finally:
            if built is not None and built.worker is not None:
                built.worker.stop()
            _finish_wandb()
            pool.shutdown()


def attach_callbacks(built, pool, config: JobConfig, stop: GracefulStop):
    """The rollout side's metrics in every log, one console line per step instead of
    transformers' dicts, the stop on a signal, and the rollout state in every checkpoint;
    returns the last, whose `saves` time each checkpoint."""
    trainer = built.trainer
    attach_rollout_logging(trainer, pool, built.transfer)
    quiet_default_printing(trainer)
    trainer.add_callback(console_callback(config.trainer.max_steps))
    trainer.add_callback(stop.callback(save=config.save_steps > 0))
    saver = rollout_state_callback(
        lambda: {
            "dataset_position": built.dataset_position(),
            "model_version": pool.version,
            "wandb_run_id": os.environ["WANDB_RUN_ID"],
        }
    )
    trainer.add_callback(saver)
    return saver


def save_final_model(trainer, tokenizer, out: Path) -> Path:
    """The trained model and its tokenizer, in Hugging Face format, at <output_dir>/final_model:
    loadable by transformers and by LLMEngine(EngineConfig(model=...))."""
    folder = out / "final_model"
    trainer.save_model(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def prepare_run_directory(config: JobConfig) -> Path:
    """The output directory (a `JobInputError` naming output_dir when it cannot be one), the
    environment defaults, and W&B inside the run directory (offline unless asked otherwise)."""
    out = Path(config.output_dir).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next(p for p in (out, *out.parents) if p.exists() and not p.is_dir())
        raise JobInputError(
            f"output_dir={config.output_dir}: {blocking} is a file, not a folder; choose another "
            "output_dir"
        ) from None
    except OSError as err:
        raise JobInputError(
            f"output_dir={config.output_dir}: {out} cannot be created ({err.strerror}); choose "
            "a folder you can write to"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise JobInputError(
            f"output_dir={config.output_dir}: {out} is not writable; choose a folder you can "
            "write to"
        )
    set_process_env_defaults()
    os.environ["WANDB_MODE"] = config.wandb.mode
    os.environ.setdefault("WANDB_PROJECT", config.wandb.project)
    os.environ["WANDB_DIR"] = str(out)
    os.environ.setdefault("WANDB_CACHE_DIR", str(out / "wandb-cache"))
    os.environ.setdefault("WANDB_SILENT", "true")
    return out


@contextlib.contextmanager
def ray_session(config: JobConfig, placement) -> Iterator[None]:
    """Joins the Ray the job runs in (`ray job submit`, `ray_address`: its resources are set by
    `ray start`), or starts one here that sees only the actors' GPUs (the trainer keeps cuda:0)
    and stops it on the way out."""
    import ray

    if ray.is_initialized():
        yield
        return
    joining = bool(config.ray_address or os.environ.get("RAY_ADDRESS"))
    with ray_sees(None if joining else placement.ray_gpus):
        ray.init(
            # Not joining: a Ray of its own, even when `ray start` left one running here.
            address=(config.ray_address or None) if joining else "local",
            ignore_reinit_error=True,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            **({} if joining else placement.ray_init_kwargs),
        )
    # A session of our own ends with the job even if the job is killed outright.
    reaper = None if joining else start_session_reaper(local_session_name())
    try:
        yield
    finally:
        ray.shutdown()
        if reaper is not None:  # Ray has ended in order: nothing left to watch
            reaper.kill()
            reaper.wait()


def train(trainer, config: JobConfig, resume: Path | None) -> float:
    """Run the trainer (from `resume` when given); returns the seconds it took."""
    import torch

    start = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except torch.OutOfMemoryError as err:
        raise RuntimeError(
            f"the trainer ran out of GPU memory with trainer.token_budget={config.token_budget} "
            f"({trainer.args.gradient_accumulation_steps} forwards per step). Lower "
            "trainer.token_budget (it must stay >= rollout.engine.max_model_len), or turn on "
            "trainer.gradient_checkpointing"
        ) from err
    return time.perf_counter() - start


def _finish_wandb() -> None:
    """Close the W&B run TRL opened, so its files are complete and a next job starts its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()  # its settings (the run directory) are cached per process otherwise
