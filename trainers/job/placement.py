"""A job's seats: where each trainer rank and each rollout actor runs (a node, a GPU or none,
and its share of it), and which backend syncs the weights. `layouts.plan_placement` plans them
from the cluster's nodes; seats_on_ray.py puts them into Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Shares of one GPU when the trainer and an actor sit on it: the actor's engine takes 45% of the
# memory for weights and KV cache, the trainer is capped at 50%.
SHARED_ENGINE_MEMORY = 0.45
SHARED_TRAINER_MEMORY = 0.5
CPUS_PER_RANK = 1.0
MIN_BUNDLE_CPU = 0.01  # Ray refuses an empty bundle; an actor asking for 0 CPUs gets this


class PlacementError(ValueError):
    """The layout asked for does not fit the cluster (one line: what to change)."""


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str
    cpus: float
    gpus: int
    driver: bool = False
    """The node this script runs on."""


@dataclass(frozen=True)
class Seat:
    role: str  # "trainer" or "actor"
    index: int  # trainer rank or actor id
    node: Node
    gpu: int | None  # the GPU's number among the node's (None: CPU only)
    gpu_share: float  # of that GPU, as Ray counts it
    memory_share: float | None  # of that GPU's memory it may use (None: no GPU)
    cpus: float


@dataclass(frozen=True)
class Placement:
    layout: str
    ranks: tuple[Seat, ...]
    actors: tuple[Seat, ...]
    weight_sync_backend: str
    """NCCL needs a GPU per rank: a trainer sharing its GPU with an actor syncs over CUDA IPC."""
    trainer_in_driver: bool
    """One rank on a Ray started here: the trainer is this process (the laptop default)."""
    engine_overrides: dict = field(default_factory=dict)
    ray_init_kwargs: dict = field(default_factory=dict)
    """For a Ray started here (ignored when joining a running cluster)."""
    ray_gpus: list[int] | None = None
    """This process's GPU indices that a Ray started here may hand to actors (None: all)."""
    trainer_memory_fraction: float | None = None
    """The trainer's cap on its GPU's memory when an actor shares it (None: no cap)."""

    @property
    def num_actors(self) -> int:
        return len(self.actors)

    @property
    def num_processes(self) -> int:
        return len(self.ranks)

    @property
    def each_rank_syncs_its_actor(self) -> bool:
        """Colocated ranks: rank i sends its weights to actor i, beside it, itself (rank 0's pool
        still pauses, resumes and counts versions). Otherwise rank 0 sends to every actor."""
        return self.layout == "colocated" and self.num_processes > 1

    @property
    def gpus_per_actor(self) -> float:
        return self.actors[0].gpu_share

    @property
    def trainer_device(self) -> str:
        """The trainer's device as its own process names it (Ray shows each rank its GPU as 0)."""
        return "cpu" if self.ranks[0].gpu is None else "cuda:0"

    def engine_settings(self, user: dict) -> dict:
        """EngineConfig fields for the actors: this placement's, then the user's
        `rollout.engine` on top (a user who sets gpu_memory_utilization or device means it)."""
        return {**self.engine_overrides, **user}

    def describe(self) -> list[str]:
        """One line per trainer rank and actor: node, GPU, memory share; then the sync."""
        lines = [
            f"layout {self.layout}: {self.num_processes} trainer rank(s), {self.num_actors} "
            f"rollout actor(s), weight sync over {self.weight_sync_backend}"
            + (", each rank to the actor beside it" if self.each_rank_syncs_its_actor else "")
            + ("; the trainer runs in this process" if self.trainer_in_driver else "")
        ]
        for seat in (*self.ranks, *self.actors):
            name = f"trainer rank {seat.index}" if seat.role == "trainer" else f"actor {seat.index}"
            where = f"node {seat.node.address} ({seat.node.node_id[:8]})"
            if seat.gpu is None:
                device = f"CPU ({seat.cpus:g} core(s))"
            else:
                device = f"GPU {seat.gpu} ({seat.gpu_share:g} of it"
                device += f", {seat.memory_share:.0%} of its memory)"
            lines.append(f"  {name:<16} {where:<32} {device}")
        return lines

    def summary(self) -> dict:
        return {
            "layout": self.layout,
            "trainer_processes": self.num_processes,
            "num_actors": self.num_actors,
            "weight_sync_backend": self.weight_sync_backend,
            "seats": [
                {
                    "role": s.role,
                    "index": s.index,
                    "node": s.node.address,
                    "node_id": s.node.node_id,
                    "gpu": s.gpu,
                }
                for s in (*self.ranks, *self.actors)
            ],
        }
