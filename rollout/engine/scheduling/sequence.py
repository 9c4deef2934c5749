"""One sequence (one sample of one prompt) as the scheduler sees it, and the result it ends with."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.sample_keys import sample_keys

PLACEHOLDER = -1
"""Token id of a sampled token that is still on the device (filled by carry-over, then on the host)."""


class Status(enum.Enum):
    WAITING = "waiting"  # needs (re)prefill; holds no blocks
    RUNNING = "running"  # holds blocks; prefill in progress or decoding
    FINISHED = "finished"


@dataclass
class Completion:
    """What a request's sample ends with: exactly one per sample, whatever happened."""

    index: int
    """Position in the call's output order: prompt i's samples are at [i*n, (i+1)*n)."""
    prompt_token_ids: list[int]
    token_ids: list[int]
    """Generated tokens; the EOS/stop token is included when it ended the sample."""
    logprobs: list[float]
    """One fp32 logprob per generated token, after temperature (raw distribution when greedy)."""
    finish_reason: str
    """"stop", "length", "abort" or "error"."""
    error: str | None = None
    request_id: str = ""
    routes: object | None = None
    """With EngineConfig.record_routes: np.ndarray [prompt + output tokens - 1, num_routers,
    top_k], the experts each fed token (every token but the last) was routed to in each MoE
    layer; None otherwise."""
    queue_wait_s: float = 0.0
    """Seconds from add_request to the first step that computed this request (time spent waiting
    for room in the batch or the KV cache)."""


@dataclass(eq=False)
class Sequence:
    """Host state of one sample. Token ids hold PLACEHOLDER where a sample is still on the device."""

    seq_id: int
    request_id: str
    index: int
    params: SamplingParams
    seed: int
    sample_index: int
    prompt_token_ids: list[int]
    arrival: int
    """Admission order; preemption picks the largest (the newest)."""
    arrival_time: float = 0.0
    """time.monotonic() at add_request."""
    first_scheduled_time: float | None = None
    """time.monotonic() when a step first computed it (a recompute after preemption keeps it)."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    table_row: int = -1
    """Row of the scheduler's block-table mirror while running (-1 otherwise)."""
    status: Status = Status.WAITING
    num_forks_pending: int = 0
    """Samples still to fork off this one when its prompt is done (n - 1 for a new group's first)."""
    pending_step: int = -1
    """Id of the in-flight step whose sampled token fills the last PLACEHOLDER (-1: none)."""
    pending_row: int = -1
    """Row of that step's sampler output holding the token (the carry-over source)."""
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0
    token_limit: int = 0
    """Length at which it stops with reason "length" (set by the scheduler: prompt + max_tokens,
    capped by max_model_len); kept here because every step reads it for every sequence."""
    ngrams: object | None = None
    """Its group's n-gram index (ngram_drafts.GroupNgrams) when the engine speculates; shared
    by the group's samples."""
    block_digests: list[bytes] = field(default_factory=list)
    """Prefix-cache digests of its leading full blocks, computed once each (a full block of
    known tokens never changes; PrefixRegistry._digests extends it)."""
    cache_epoch: int = -1
    """The prefix cache's epoch when it was last admitted: its KV may be offered to the cache
    only while the epoch (the weights) is the same."""
    draft_len: int = 0
    """How many draft tokens to propose next (adapted to how many were accepted; 0: the most)."""
    routes: object | None = None
    """Its route_traces.RouteTrace while the engine records routes (None otherwise)."""
    sample_key: int = field(init=False, default=0)
    """(seed, sample index) hashed once (sample_keys.py); a step adds each token's position."""

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        seed, index = np.array([self.seed], np.uint64), np.array([self.sample_index], np.uint64)
        self.sample_key = int(sample_keys(seed, index)[0])

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def num_resolved_tokens(self) -> int:
        """Its tokens up to the first PLACEHOLDER still waiting for a step's result."""
        n = len(self.token_ids)
        while n > len(self.prompt_token_ids) and self.token_ids[n - 1] == PLACEHOLDER:
            n -= 1
        return n

    def sibling(self, seq_id: int, sample_index: int, status: Status) -> Sequence:
        """Another sample of its group (request), with the group's prompt, seed and n-gram
        index and the prompt's block digests; no blocks yet, no tokens past the prompt."""
        child = Sequence(
            seq_id=seq_id,
            request_id=self.request_id,
            index=self.index - self.sample_index + sample_index,
            params=self.params,
            seed=self.seed,
            sample_index=sample_index,
            prompt_token_ids=self.prompt_token_ids,
            arrival=self.arrival,
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            status=status,
        )
        child.block_digests = list(self.block_digests)  # the shared prompt's
        if self.ngrams is not None:
            child.ngrams = self.ngrams
            child.ngrams.members.append(child)
        return child

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def has_pending_token(self) -> bool:
        return self.pending_step >= 0

    def to_completion(self) -> Completion:
        assert self.is_finished and self.finish_reason is not None, "only finished sequences"
        outputs = self.token_ids[self.num_prompt_tokens :]
        assert PLACEHOLDER not in outputs, "a finished sequence must have no pending token"
        return Completion(
            index=self.index,
            prompt_token_ids=list(self.prompt_token_ids),
            token_ids=outputs,
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            error=self.error,
            request_id=self.request_id,
            routes=self.routes.take(self.num_tokens - 1) if self.routes is not None else None,
            queue_wait_s=(
                self.first_scheduled_time - self.arrival_time
                if self.first_scheduled_time is not None
                else 0.0
            ),
        )
