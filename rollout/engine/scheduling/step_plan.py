"""What one step runs: the scheduler's decision, read by the input builder and the step loops.

Plain data, no torch. Token ids may be PLACEHOLDERs that the device fills from the previous
step's sampler output (see rollout.engine.scheduling.scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollout.engine.scheduling.sequence import Sequence


@dataclass(slots=True)
class ScheduledChunk:
    """One sequence's share of a step: positions [start, start + len(token_ids))."""

    seq: Sequence
    start: int
    token_ids: list[int]
    """Input token ids; the last may be a PLACEHOLDER filled on the device from `carry_row`."""
    carry_row: int
    """Row of the previous step's sampler output that fills the last input token (-1: none)."""
    num_samples: int
    """0 for a prefill chunk that does not reach the end; else 1, or n for a new group's prompt
    (or 1 + num_drafts for a verification)."""
    num_drafts: int = 0
    """A verification: its last num_drafts input tokens are drafts, and the sampler draws a token
    after each of its last num_drafts + 1 positions."""


@dataclass(slots=True)
class SampleRow:
    """One token the sampler draws this step."""

    seq: Sequence
    position: int
    """Index into seq.token_ids where the token goes (holds a PLACEHOLDER until the result)."""
    chunk_index: int
    """Which chunk's last token's logits it is drawn from (G rows share one for a new group)."""
    draft_index: int = -1
    """In a verification: j, drawn after the chunk's j-th draft (0: after its real last token),
    from the logits of that position; -1 otherwise."""


@dataclass
class StepPlan:
    step_id: int
    chunks: list[ScheduledChunk]
    rows: list[SampleRow]
    block_copies: list[tuple[int, int]]
    """(src, dst) KV blocks to copy before the forward (copy-on-write of shared blocks)."""
    num_tokens: int
    num_preempted: int = 0
    speculative: bool = False
    """It verifies drafts: the next step can be scheduled only once its results are in."""
    completed_prefills: list[tuple[Sequence, int]] = field(default_factory=list)
    """(sequence, end) of chunks that reach their sequence's end: blocks for the prefix cache."""
