"""The GRPO job: Ray rollout actors -> RolloutPool -> TRL trainer -> weights back; W&B; summary.

run_job(config)
  prepare_run_directory    the environment defaults, W&B inside the run directory
  check_inputs, resume     the user's inputs and the checkpoint, checked before Ray
  ray_session              join the cluster the job runs in, or start a local Ray
  plan_placement           trainer ranks and actors on the cluster's nodes (placement.py)
  train_process            here (one rank on a Ray started here), or on every trainer rank
                           (trainer_ranks.py): the pool, the TRL trainer, train, final model,
                           summary.json (training.py)
plan_job(config) is `--plan`: the layout the job would use on the cluster it sees, started nowhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from rollout.process_env import set_process_env_defaults
from trainers.job.checkpoints import checkpoints, read_rollout_state, wandb_run_id
from trainers.job.config import JobConfig
from trainers.job.layouts import plan_placement, this_machine
from trainers.job.placement import Placement, PlacementError
from trainers.job.preflight import JobInputError, check_inputs
from trainers.job.resume import resolve_resume
from trainers.job.seats_on_ray import (
    cluster_nodes,
    local_ray_cpus,
    placement_group_for,
    ray_address_answers,
    ray_sees,
    scheduling,
)
from trainers.job.session_reaper import local_session_name, start_session_reaper
from trainers.job.stopping import GracefulStop
from trainers.job.training import Run, train_process


def fp8_notice(config: JobConfig) -> str:
    """What FP8 rollouts mean for this run's loss."""
    chosen = config.off_policy_correction
    if chosen == "none":
        return (
            "the actors sample with FP8 (weights or KV) and trainer.off_policy_correction is none: the "
            "loss does not correct for their drift from the bf16 policy (off_policy/kl shows it)"
        )
    how = "auto" if config.trainer.off_policy_correction == "auto" else "as set"
    notice = (
        f"the actors sample with FP8 (weights or KV): trainer.off_policy_correction={chosen} ({how}, "
        f"cap {config.trainer.off_policy_cap}) corrects for their drift from the bf16 policy"
    )
    if config.engine_settings_for_trainer.get("fp8_keep_unrounded"):
        notice += (
            "; with LoRA they keep the unrounded base weights in host memory, so each adapter "
            "is rounded once"
        )
    return notice


def run_job(config: JobConfig) -> dict:
    out = prepare_run_directory(config)
    # Everything the user gave, checked before Ray: a mistake fails in seconds, in one line.
    inputs = check_inputs(config)
    # The checkpoint too: a missing or damaged file stops the run here, not inside the trainer.
    resume = resolve_resume(config.trainer.resume_from_checkpoint, out)
    saved = read_rollout_state(resume)
    if resume is None and checkpoints(out):
        print(
            f"[train_grpo] {out} holds checkpoints of an earlier run: this one starts over (a "
            "new W&B run) and replaces them as it saves; set "
            "trainer.resume_from_checkpoint=latest to continue that run instead"
        )
    os.environ["WANDB_RUN_ID"] = saved.get("wandb_run_id") or wandb_run_id(out, resume is not None)
    os.environ["WANDB_RESUME"] = "allow"
    stop = GracefulStop()
    # Ray installs its own SIGTERM handler when it starts: ours goes in after it.
    with ray_session(config) as placement, stop.installed():
        print(
            f"[train_grpo] {placement.num_processes} trainer rank(s) and "
            f"{placement.num_actors} rollout actor(s) ({placement.layout}), trainer on "
            f"{'this process' if placement.trainer_in_driver else 'Ray'}, weight sync over "
            f"{placement.weight_sync_backend}" + (f"; resuming from {resume}" if resume else "")
        )
        if config.fp8_rollouts:
            print(f"[train_grpo] {fp8_notice(config)}")
        if placement.trainer_in_driver:
            return train_process(Run(config, inputs, out, placement, saved, resume), stop)
        import ray

        from trainers.job.trainer_ranks import run_on_ranks

        group, seats = placement_group_for(placement, ray)
        run = Run(
            config,
            None,
            out,
            placement,
            saved,
            resume,
            actor_options=lambda i: {"scheduling_strategy": _seat(group, seats, i)},
        )
        env = {k: v for k, v in os.environ.items() if k.startswith(("WANDB_", "HF_"))}
        try:
            return run_on_ranks(run, group, seats, stop, env)
        finally:
            ray.util.remove_placement_group(group)


def _local_ray_kwargs(placement: Placement) -> dict:
    return {"num_cpus": local_ray_cpus(placement), **placement.ray_init_kwargs}


def _seat(group, seats: dict, actor: int):
    return scheduling(group, seats[("actor", actor)])


def plan_job(config: JobConfig) -> list[str]:
    """`--plan`: the layout's lines for the cluster the job would run on (joined only to read
    its nodes; a Ray of our own is not started: this machine is described instead)."""
    with ray_session(config, start_local=False) as placement:
        return placement.describe()


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
def ray_session(config: JobConfig, start_local: bool = True) -> Iterator[Placement]:
    """Joins the Ray the job runs in (`ray job submit`, `ray_address`: its resources are set by
    `ray start`) and plans on its nodes, or plans on this machine and starts a Ray here that
    sees only the actors' GPUs (a trainer in this process keeps cuda:0), stopped on the way out
    (`start_local=False`: only the plan). Yields the Placement; a layout the cluster cannot hold
    is a JobInputError, raised before any work."""
    import ray

    def planned(nodes, joining: bool) -> Placement:
        try:
            return plan_placement(
                config.rollout, config.trainer.num_processes, nodes, joining=joining
            )
        except PlacementError as err:
            raise JobInputError(str(err)) from None

    joining = ray.is_initialized() or bool(config.ray_address or os.environ.get("RAY_ADDRESS"))
    placement = None
    if not joining:
        import torch

        placement = planned([this_machine(torch.cuda.device_count())], joining=False)
        if not start_local:
            yield placement
            return
    started_here = not ray.is_initialized()
    if started_here:
        address = (config.ray_address or None) if joining else "local"
        where = address or os.environ.get("RAY_ADDRESS")
        if joining and where and (why := ray_address_answers(where)) is not None:
            raise JobInputError(
                f"ray_address={where}: nothing answers there ({why}). Check the head node's "
                "address and port (`ray status` on it), or leave ray_address unset to run on "
                "this machine"
            )
        with ray_sees(None if joining else placement.ray_gpus):
            try:
                ray.init(
                    # Not joining: a Ray of our own, even when `ray start` left one running here.
                    address=address,
                    ignore_reinit_error=True,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                    **({} if joining else _local_ray_kwargs(placement)),
                )
            except ConnectionError:  # no Ray at the address: the user's setting
                raise JobInputError(
                    f"ray_address={where}: no running Ray found there. Start one "
                    "(`ray start --head`), point ray_address at it, or leave ray_address unset "
                    "to run on this machine"
                ) from None
    # A session of our own ends with the job even if the job is killed outright.
    reaper = None if joining else start_session_reaper(local_session_name())
    try:
        if joining:
            placement = planned(cluster_nodes(ray), joining=True)
        yield placement
    finally:
        if started_here:
            ray.shutdown()
        if reaper is not None:  # Ray has ended in order: nothing left to watch
            reaper.kill()
            reaper.wait()
