"""What travels between the trainer process and the rollout actors (plain, picklable data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollout.engine.sampling_params import SamplingParams
from rollout.environments.base import EpisodeLimits


@dataclass(frozen=True)
class GroupRequest:
    """One prompt and its G samples (`params.n`), generated together on one actor."""

    group_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    attempt: int = 0
    """Bumped when the group is generated again after its actor died; late results of an older
    attempt are ignored."""
    environment: str | None = None
    """A multi-turn group: the environment class ("module:Class" or "file.py:Class") whose
    instances run its params.n episodes; its reset(row) gives the prompt (prompt_token_ids is
    then unused)."""
    row: dict | None = None
    """The dataset row the environment starts from."""
    limits: EpisodeLimits | None = None


@dataclass
class FinishedSample:
    """One finished sample, streamed back as soon as it ends."""

    group_id: int
    attempt: int
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    error: str | None
    weight_versions: tuple[int, int]
    """(version when the group started, version when this sample finished): equal unless a weight
    update landed while it was being generated."""
    actor: int
    received_at: float
    """Wall-clock time (time.time()) the actor queued the group in its engine."""
    finished_at: float
    """Wall-clock time this sample finished."""
    queue_wait_s: float = 0.0
    """Seconds it waited in the engine for room (batch slots or KV blocks) before its first step."""
    completion_mask: list[int] | None = None
    """Multi-turn: 1 on the model's tokens, 0 on the environment's (None: all the model's)."""
    reward: float | None = None
    """Multi-turn: the environment's reward for the episode (None when it gave none)."""
    episode_status: str | None = None
    """Multi-turn: "done", "max_turns", "max_tokens", "tool_error", "tool_timeout", ..."""
    num_turns: int = 0
    token_versions: list[tuple[int, int]] | None = None
    """The weight version of every generated token, run-length coded: (tokens, version) runs in
    order, summing to len(token_ids). None for a multi-turn episode (whose turns are separate
    engine requests): only `weight_versions` is known there."""
    routes: Any = None
    """With the engine's record_routes: the experts each fed token chose in each MoE layer,
    np.ndarray [prompt + completion tokens - 1, num_routers, top_k] (Completion.routes)."""


@dataclass
class CompletedGroup:
    """All G samples of a group, in sample order; delivered exactly once."""

    group_id: int
    samples: list[FinishedSample]
    metadata: dict = field(default_factory=dict)

    @property
    def weight_versions(self) -> tuple[int, int]:
        return (
            min(s.weight_versions[0] for s in self.samples),
            max(s.weight_versions[1] for s in self.samples),
        )


@dataclass(frozen=True)
class ActorDeath:
    """A rollout actor the pool lost: its groups were regenerated on the others."""

    actor: int
    at: float
    """Wall-clock time (time.time()) the pool noticed."""
    error: str
    live_actors: int
    """Actors still alive after it."""
