"""Speculative decoding's side of the scheduler: when to try, drafts in, verification chunks out,
and the results turned into emitted tokens. No torch here.

A verification is one chunk of a decoding sequence's last token and its drafts, with a sampler
row after each of them. Row j draws, with the key of its own output position, exactly the token
a plain step would draw there; `Speculation.verify` emits row 0's token, then row j's while row
j - 1's token equals draft j. So speculation changes how many tokens a forward yields, never
which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollout.engine.scheduling.block_manager import BlockManager
from rollout.engine.scheduling.ngram_drafts import GroupNgrams
from rollout.engine.scheduling.sequence import Sequence
from rollout.engine.scheduling.step_plan import SampleRow, ScheduledChunk, StepPlan

FREE_MISSES = 3  # tries in a row that may gain nothing before the pauses start


@dataclass
class SpeculationStats:
    """Counts over the engine's life (the rollout metrics report their changes per interval)."""

    verifications: int = 0
    """Sequence-steps that verified drafts."""
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    """Tokens the verifications produced (accepted drafts + one sampled token each)."""


class Speculation:
    """The scheduler's speculative decoding: its settings, the pause after tries that gained
    nothing, the drafts, the verification chunks and what their results emit. It never finishes
    or preempts a sequence: `verify` returns why a sample ends and the scheduler ends it."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_drafts: int,
        max_seqs: int,
        max_pause: int,
        end_reason: Callable[[Sequence, int, int], str | None],
    ) -> None:
        self.block_manager = block_manager
        self.max_drafts = max_drafts
        """Most draft tokens one verification checks (0: no speculation)."""
        self.max_seqs = max_seqs
        """Speculate only while at most this many sequences run."""
        self.max_pause = max_pause
        """After tries to speculate that gained nothing, the longest wait before the next try,
        in steps (0: try every step)."""
        self.stats = SpeculationStats()
        self._end_reason = end_reason
        """Why a sample ends with a token at a position ("stop", "length"), or None."""
        self._misses = 0
        """Tries to speculate in a row that gained nothing."""
        self._paused_until = 0
        """The first step id that may try to speculate again."""

    def prepare(self, seq: Sequence) -> None:
        """Give a new request's sequence the n-gram index its group's drafts come from."""
        if self.max_drafts:
            seq.ngrams = GroupNgrams()
            seq.ngrams.members.append(seq)

    def wants(self, num_running: int, step_id: int) -> bool:
        """Whether step `step_id` verifies drafts where it can: few sequences run, so a step
        reads the weights for a handful of tokens and drafted tokens come nearly free, and no
        run of recent tries came up empty (see `tried`)."""
        return (
            self.max_drafts > 0
            and 0 < num_running <= self.max_seqs
            and step_id >= self._paused_until
        )

    def tried(self, step_id: int, gained: bool) -> None:
        """After a step that tried to speculate: whether any draft was accepted. A try costs even
        when it finds no draft (the overlap loop runs it in the sync order), so once
        FREE_MISSES tries in a row have come up empty the next ones wait 2, 4, ... up to
        `max_pause` steps; an accepted draft ends the pause. (A real model's drafts come and
        go: pausing from the first empty try cost the built-in model a third of its gain,
        docs/performance.md.)"""
        if gained:
            self._misses = 0
            return
        self._misses += 1
        misses = self._misses - FREE_MISSES
        pause = 0 if misses <= 0 else min(2**misses, self.max_pause)
        self._paused_until = step_id + 1 + pause

    def draft(self, seq: Sequence, budget: int) -> list[int]:
        """Draft tokens for seq's next verification: at most what is left before its token
        limit (the verification emits one token more than it drafts) and in the step budget."""
        most = min(
            seq.draft_len or self.max_drafts,
            seq.token_limit - len(seq.token_ids) - 1,
            budget - 1,
        )
        return seq.ngrams.propose(seq, most) if most > 0 else []

    def add_verification(self, plan: StepPlan, seq: Sequence, draft: list[int]) -> int:
        """One chunk of seq's last token and the drafts after it, and a sampler row after each
        of them; returns its token count. The scheduler has given seq the blocks for them. The
        drafts' KV is written; what is rejected lies past the sequence's end and is overwritten
        later. The tokens are appended when the results are in (`verify`)."""
        start = seq.num_computed_tokens
        assert start == len(seq.token_ids) - 1, "a verification follows a known last token"
        chunk_index = len(plan.chunks)
        token_ids = [seq.token_ids[start], *draft]
        plan.chunks.append(
            ScheduledChunk(seq, start, token_ids, -1, len(token_ids), num_drafts=len(draft))
        )
        plan.num_tokens += len(token_ids)
        plan.speculative = True
        seq.num_computed_tokens = start + len(token_ids)  # as if every draft were accepted
        seq.pending_step, seq.pending_row = plan.step_id, len(plan.rows)
        for j in range(len(token_ids)):
            plan.rows.append(SampleRow(seq, start + 1 + j, chunk_index, draft_index=j))
        self.stats.verifications += 1
        self.stats.drafted += len(draft)
        return len(token_ids)

    def verify(self, plan: StepPlan, sample: SampleRow, token: int, logprob: float) -> str | None:
        """Row j of a verification: the token the plain sampler draws after the chunk's j-th
        input. It counts when every draft before it was accepted, i.e. the previous row's token
        equals the draft it was checked against; each counted row emits its token, so the
        emitted tokens are exactly those a step per token would have drawn. Returns why the
        sample ends with it ("stop", "length": the scheduler finishes it, keeping the token),
        or None."""
        seq, j = sample.seq, sample.draft_index
        position = sample.position
        if len(seq.token_ids) != position:
            return None  # an earlier row was rejected or ended the sample
        chunk = plan.chunks[sample.chunk_index]
        if j > 0:
            if seq.token_ids[position - 1] != chunk.token_ids[j]:
                return None  # the draft before this row was rejected
            self.stats.accepted += 1
        seq.token_ids.append(token)
        seq.logprobs.append(logprob)
        seq.num_computed_tokens = position  # the accepted drafts' KV is the sampled tokens' KV
        seq.pending_step = seq.pending_row = -1
        # Adapt: double the next draft while drafts are accepted, shrink it when they are not.
        seq.draft_len = min(self.max_drafts, max(1, 2 * j))
        self.stats.emitted += 1
        reason = self._end_reason(seq, token, position)
        if reason is None and (j == chunk.num_drafts or token != chunk.token_ids[j + 1]):
            # The verification ends here: blocks that only held rejected drafts go back.
            bm = self.block_manager
            bm.truncate(seq.block_table, bm.num_blocks_for(position))
        return reason
