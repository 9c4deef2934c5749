"""Where the trainer and the rollout actors run, from the GPUs this machine has."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field

from trainers.job.config import RolloutConfig


@dataclass(frozen=True)
class Placement:
    num_actors: int
    gpus_per_actor: float
    trainer_device: str
    weight_sync_backend: str
    """NCCL needs a GPU per rank: a trainer sharing its GPU with an actor syncs over CUDA IPC."""
    engine_overrides: dict = field(default_factory=dict)
    ray_init_kwargs: dict = field(default_factory=dict)
    """For a Ray started here (ignored when joining a running cluster)."""
    ray_gpus: list[int] | None = None
    """This process's GPU indices that a Ray started here may hand to actors (None: all)."""
    trainer_memory_fraction: float | None = None
    """The trainer's cap on its GPU's memory when an actor shares it (None: no cap)."""

    def engine_settings(self, user: dict) -> dict:
        """EngineConfig fields for the actors: this placement's, then the user's
        `rollout.engine` on top (a user who sets gpu_memory_utilization or device means it)."""
        return {**self.engine_overrides, **user}


def plan_placement(rollout: RolloutConfig, num_gpus: int) -> Placement:
    placement = _plan(rollout, num_gpus)
    if rollout.weight_sync_backend == "auto":
        return placement
    if rollout.weight_sync_backend == "nccl" and placement.weight_sync_backend != "nccl":
        raise ValueError(
            "rollout.weight_sync_backend=nccl needs the trainer and every actor on GPUs of their "
            f"own; this machine has {num_gpus} GPU(s). Use auto or gloo"
        )
    if rollout.weight_sync_backend == "cuda_ipc" and placement.weight_sync_backend != "cuda_ipc":
        raise ValueError(
            "rollout.weight_sync_backend=cuda_ipc needs the trainer and its one actor on the same "
            f"GPU (a machine with exactly one GPU); this machine has {num_gpus}. Use auto"
        )
    return dataclasses.replace(placement, weight_sync_backend=rollout.weight_sync_backend)


def _plan(rollout: RolloutConfig, num_gpus: int) -> Placement:
    """CPU: `rollout.num_actors` CPU actors. Several GPUs: the trainer takes the first (where
    transformers' Trainer puts a single-process run) and each other GPU gets an actor. One GPU:
    the trainer and one actor share it, the actor's engine held to 45% of its memory and the
    trainer to 50%, and the weights go through CUDA IPC."""
    if num_gpus == 0:
        return Placement(
            num_actors=max(1, rollout.num_actors),
            gpus_per_actor=0.0,
            trainer_device="cpu",
            weight_sync_backend="gloo",
            engine_overrides={"device": "cpu"},
        )
    if num_gpus == 1:
        return Placement(
            num_actors=1,
            gpus_per_actor=0.5,
            trainer_device="cuda:0",
            weight_sync_backend="cuda_ipc",
            engine_overrides={"device": "cuda", "gpu_memory_utilization": 0.45},
            trainer_memory_fraction=0.5,
            ray_init_kwargs={"num_gpus": 1},
        )
    actors = rollout.num_actors if 0 < rollout.num_actors < num_gpus else num_gpus - 1
    return Placement(
        num_actors=actors,
        gpus_per_actor=1.0,
        trainer_device="cuda:0",
        weight_sync_backend="nccl",
        ray_gpus=list(range(1, num_gpus)),
        engine_overrides={"device": "cuda"},
        ray_init_kwargs={"num_gpus": num_gpus - 1},
    )


def ray_visible_devices(gpus: list[int], environ: dict[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES for a Ray started here that should hand out only `gpus` (indices as
    this process sees them, mapped through any CUDA_VISIBLE_DEVICES it already has): Ray then
    numbers and assigns exactly those devices."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    physical = visible.split(",") if visible else None
    return ",".join(physical[i] if physical else str(i) for i in gpus)


@contextlib.contextmanager
def ray_sees(gpus: list[int] | None):
    """CUDA_VISIBLE_DEVICES = `gpus` while Ray starts (its node process inherits it and hands
    out only those), then back as it was for this process."""
    if gpus is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ray_visible_devices(gpus, os.environ)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
