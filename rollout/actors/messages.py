"""What travels between the trainer process and the rollout actors (plain, picklable data)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class GroupRequest:
    """One prompt and its G samples (`params.n`), generated together on one actor."""

    group_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    attempt: int = 0
    """Bumped when the group is generated again after its actor died; late results of an older
    attempt are ignored."""


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
