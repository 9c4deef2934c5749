"""Speculative decoding's side of the scheduler: drafts in, verification chunks out, and the
results turned into emitted tokens. No torch here.

A verification is one chunk of a decoding sequence's last token and its drafts, with a sampler
row after each of them. Row j draws, with the key of its own output position, exactly the token
a plain step would draw there; `_verify` emits row 0's token, then row j's while row j - 1's
token equals draft j. So speculation changes how many tokens a forward yields, never which.
"""

from __future__ import annotations

from dataclasses import dataclass

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


class DraftVerification:
    """Mixed into Scheduler (it reads the scheduler's speculative settings, block manager,
    block-table mirror, `_end_reason` and `_finish`)."""

    def wants_speculation(self) -> bool:
        """Whether the next step verifies drafts where it can: few sequences run, so a step
        reads the weights for a handful of tokens and drafted tokens come nearly free, and no
        run of recent tries came up empty (see `_speculation_result`)."""
        return (
            self.speculative_tokens > 0
            and 0 < len(self.running) <= self.speculative_max_seqs
            and self._next_step >= self._speculation_paused_until
        )

    def _speculation_result(self, step_id: int, gained: bool) -> None:
        """After a step that tried to speculate: whether any draft was accepted. A try costs even
        when it finds no draft (the overlap loop runs it in the sync order), so once
        FREE_MISSES tries in a row have come up empty the next ones wait 2, 4, ... up to
        `speculation_max_pause` steps; an accepted draft ends the pause. (A real model's drafts
        come and go: pausing from the first empty try cost the built-in model a third of its
        gain, docs/performance.md.)"""
        if gained:
            self._speculation_misses = 0
            return
        self._speculation_misses += 1
        misses = self._speculation_misses - FREE_MISSES
        pause = 0 if misses <= 0 else min(2**misses, self.speculation_max_pause)
        self._speculation_paused_until = step_id + 1 + pause

    def _draft(self, seq: Sequence, budget: int) -> list[int]:
        """Draft tokens for seq's next verification: at most what is left before its token
        limit (the verification emits one token more than it drafts) and in the step budget."""
        most = min(
            seq.draft_len or self.speculative_tokens,
            seq.token_limit - len(seq.token_ids) - 1,
            budget - 1,
        )
        return seq.ngrams.propose(seq, most) if most > 0 else []

    def _add_verification(
        self, plan: StepPlan, seq: Sequence, draft: list[int], blocks_needed: int
    ) -> int:
        """One chunk of seq's last token and the drafts after it, and a sampler row after each
        of them. The drafts' KV is written; what is rejected lies past the sequence's end and is
        overwritten later. The tokens are appended when the results are in (`_verify`)."""
        start = seq.num_computed_tokens
        end = start + 1 + len(draft)
        assert start == len(seq.token_ids) - 1, "a verification follows a known last token"
        if blocks_needed:
            plan.block_copies += self.block_manager.append(seq.block_table, start, end)
            self.table_rows[seq.table_row, : len(seq.block_table)] = seq.block_table
        chunk_index = len(plan.chunks)
        token_ids = [seq.token_ids[start], *draft]
        plan.chunks.append(
            ScheduledChunk(seq, start, token_ids, -1, len(token_ids), num_drafts=len(draft))
        )
        plan.num_tokens += len(token_ids)
        plan.speculative = True
        seq.num_computed_tokens = end  # as if every draft were accepted, until the results
        seq.pending_step, seq.pending_row = plan.step_id, len(plan.rows)
        for j in range(len(token_ids)):
            plan.rows.append(SampleRow(seq, start + 1 + j, chunk_index, draft_index=j))
        self.speculation.verifications += 1
        self.speculation.drafted += len(draft)
        return len(token_ids)

    def _verify(self, plan: StepPlan, sample: SampleRow, token: int, logprob: float) -> bool:
        """Row j of a verification: the token the plain sampler draws after the chunk's j-th
        input. It counts when every draft before it was accepted, i.e. the previous row's token
        equals the draft it was checked against; each counted row emits its token, so the
        emitted tokens are exactly those a step per token would have drawn. Returns whether
        the sequence finished (stop token, EOS or length)."""
        seq, j = sample.seq, sample.draft_index
        position = sample.position
        if len(seq.token_ids) != position:
            return False  # an earlier row was rejected or ended the sample
        chunk = plan.chunks[sample.chunk_index]
        if j > 0:
            if seq.token_ids[position - 1] != chunk.token_ids[j]:
                return False  # the draft before this row was rejected
            self.speculation.accepted += 1
        seq.token_ids.append(token)
        seq.logprobs.append(logprob)
        seq.num_computed_tokens = position  # the accepted drafts' KV is the sampled tokens' KV
        seq.pending_step = seq.pending_row = -1
        # Adapt: double the next draft while drafts are accepted, shrink it when they are not.
        seq.draft_len = min(self.speculative_tokens, max(1, 2 * j))
        self.speculation.emitted += 1
        reason = self._end_reason(seq, token, position)
        if reason is None:
            if j == chunk.num_drafts or token != chunk.token_ids[j + 1]:
                # The verification ends here: blocks that only held rejected drafts go back.
                self.block_manager.truncate(
                    seq.block_table, self.block_manager.num_blocks_for(position)
                )
            return False
        self._finish(seq, reason, keep=position + 1)
        return True
