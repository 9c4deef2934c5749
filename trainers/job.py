"""The GRPO job: Ray rollout actors -> RolloutPool -> TRL trainer -> weights back; W&B; summary.

run_job(config)
  prepare_run_directory    the environment defaults, W&B inside the run directory
  plan_placement           where the trainer and the actors run (trainers.placement)
  ray_session              join the cluster the job runs in, or start a local Ray
  RolloutPool              the actors, each running an LLMEngine
  build_trainer            the TRL trainer of the configured mode (trainers.trainer_builder)
  train                    trainer.train(), with an out-of-memory error that names the knob
  job_summary              summary.json (trainers.summary)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rollout.builtin_models import smollm2_path
from rollout.engine.config import EngineConfig
from rollout.environment import set_environment_defaults
from trainers.config import JobConfig
from trainers.datasets import load_prompt_dataset
from trainers.placement import plan_placement, ray_sees
from trainers.prompts import PromptFormatter
from trainers.rewards import get_reward_functions
from trainers.rollout_logging import attach_rollout_logging
from trainers.summary import job_summary
from trainers.trainer_builder import JobInputs, build_trainer


def run_job(config: JobConfig) -> dict:
    out = prepare_run_directory(config)
    # Heavy imports after the environment defaults, which transformers reads at import.
    import torch
    from transformers import AutoTokenizer

    from rollout.actors.pool import RolloutPool

    model_path = str(smollm2_path()) if config.model == "smollm2" else config.model
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # The dataset and rewards before Ray: a bad name fails in seconds, not after actors load.
    dataset = load_prompt_dataset(config.dataset.source, config.dataset.num_examples, config.seed)
    reward_funcs = get_reward_functions(list(config.rewards))
    placement = plan_placement(config.rollout, torch.cuda.device_count())
    if placement.trainer_memory_fraction is not None:
        # Sharing the GPU with an actor: beyond its share the trainer gets an out-of-memory
        # error instead of starving the actor's KV cache.
        torch.cuda.set_per_process_memory_fraction(placement.trainer_memory_fraction, 0)
    with ray_session(config, placement):
        engine = EngineConfig(
            model=model_path, seed=config.seed, **placement.engine_settings(config.rollout.engine)
        )
        print(
            f"[train_grpo] {placement.num_actors} rollout actor(s), trainer on "
            f"{placement.trainer_device}, weight sync over {placement.weight_sync_backend}"
        )
        pool = RolloutPool(
            engine,
            placement.num_actors,
            num_gpus_per_actor=placement.gpus_per_actor,
            num_cpus_per_actor=config.rollout.cpus_per_actor,
        )
        try:
            built = build_trainer(
                JobInputs(
                    config=config,
                    out=out,
                    model_path=model_path,
                    tokenizer=tokenizer,
                    dataset=dataset,
                    reward_funcs=reward_funcs,
                    formatter=PromptFormatter(tokenizer),
                    pool=pool,
                    weight_sync_backend=placement.weight_sync_backend,
                    on_cpu=placement.trainer_device == "cpu",
                )
            )
            attach_rollout_logging(built.trainer, pool, built.transfer)
            seconds = train(built.trainer, config)
            if config.trainer.mode == "sync":
                built.rewards.read_from_trl_log(built.trainer.state.log_history)
            summary = job_summary(
                config,
                built.trainer,
                built.transfer,
                built.rewards,
                pool.stats(),
                seconds,
                placement,
                wandb_dir=str(out / "wandb"),
            )
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            if getattr(built.trainer, "rollout_worker", None) is not None:
                built.trainer.rollout_worker.stop()
            return summary
        finally:
            _finish_wandb()
            pool.shutdown()


def prepare_run_directory(config: JobConfig) -> Path:
    """The output directory, the environment defaults, and W&B inside the run directory
    (offline unless asked otherwise)."""
    out = Path(config.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    set_environment_defaults()
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
            address=config.ray_address,
            ignore_reinit_error=True,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            **({} if joining else placement.ray_init_kwargs),
        )
    try:
        yield
    finally:
        ray.shutdown()


def train(trainer, config: JobConfig) -> float:
    """Run the trainer; returns the seconds it took."""
    import torch

    start = time.perf_counter()
    try:
        trainer.train()
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
