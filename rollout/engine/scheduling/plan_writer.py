"""How the scheduler's decisions are written into a step's plan. No torch here.

A chunk scheduled for a sequence becomes a ScheduledChunk; the blocks its tokens need are
appended to the sequence's block table (and its row of the device's table); a chunk that reaches
the sequence's end gets a PLACEHOLDER for the token the step will sample, with the sampler row
that fills it, and a new group's prompt forks its other samples there. Which sequence runs, with
how many tokens, is the scheduler's (scheduler.py); this module only records it.
"""

from __future__ import annotations

from rollout.engine.scheduling.lifecycle import SequenceLifecycle
from rollout.engine.scheduling.sequence import PLACEHOLDER, Sequence
from rollout.engine.scheduling.step_plan import SampleRow, ScheduledChunk, StepPlan


class PlanWriter:
    def __init__(self, lifecycle: SequenceLifecycle) -> None:
        # the lifecycle's own block manager, queues and prefix registry: one set per scheduler
        self.block_manager = lifecycle.block_manager
        self._queues = lifecycle.queues
        self._prefix = lifecycle.prefix
        self._lifecycle = lifecycle

    def add_chunk(self, plan: StepPlan, seq: Sequence, num_new: int, blocks_needed: int) -> int:
        """seq's next `num_new` tokens as a chunk of the plan, growing its table first when it
        needs `blocks_needed` blocks; returns num_new."""
        start = seq.num_computed_tokens
        end = start + num_new
        assert num_new > 0 and end <= len(seq.token_ids)
        if blocks_needed:  # else the blocks are there and unshared: nothing to allocate or copy
            self.grow(plan, seq, end)
        carry_row = -1
        if seq.token_ids[end - 1] == PLACEHOLDER:
            assert seq.pending_step == plan.step_id - 1, "placeholder from an older step"
            carry_row = seq.pending_row
        assert PLACEHOLDER not in seq.token_ids[start : end - 1], "placeholder inside a chunk"
        reaches_end = end == len(seq.token_ids)
        if reaches_end and (num_new > 1 or start < seq.num_prompt_tokens) and self._prefix.enabled:
            # A prefill's last chunk (not a decode token: a sequence's generated blocks are
            # offered when it ends or is preempted, so a decode step registers nothing).
            plan.completed_prefills.append((seq, end))
        num_samples = (1 + seq.num_forks_pending) if reaches_end else 0
        chunk_index = len(plan.chunks)
        plan.chunks.append(
            ScheduledChunk(seq, start, seq.token_ids[start:end], carry_row, num_samples)
        )
        plan.num_tokens += num_new
        seq.num_computed_tokens = end
        if reaches_end:
            self._append_placeholder(plan, seq, chunk_index)
            for j in range(1, seq.num_forks_pending + 1):
                child = self._lifecycle.fork(seq, sample_index=seq.sample_index + j)
                self._append_placeholder(plan, child, chunk_index)
            seq.num_forks_pending = 0
        return num_new

    def add_decode_token(self, plan: StepPlan, seq: Sequence, start: int) -> None:
        """`add_chunk` for one generated token written into seq's own block: nothing to grow,
        no prefill to register, no fork (a group forks when its prompt ends)."""
        token_ids = seq.token_ids
        token = token_ids[start]
        assert start + 1 == len(token_ids) and seq.num_forks_pending == 0
        carry_row = -1
        if token == PLACEHOLDER:
            assert seq.pending_step == plan.step_id - 1, "placeholder from an older step"
            carry_row = seq.pending_row
        rows = plan.rows
        plan.chunks.append(ScheduledChunk(seq, start, [token], carry_row, 1))
        plan.num_tokens += 1
        seq.num_computed_tokens = start + 1
        seq.pending_step, seq.pending_row = plan.step_id, len(rows)
        token_ids.append(PLACEHOLDER)
        rows.append(SampleRow(seq, start + 1, len(plan.chunks) - 1))

    def grow(self, plan: StepPlan, seq: Sequence, end: int) -> None:
        """Give seq's block table what its tokens up to `end` need (new blocks, copies of shared
        ones the step writes into) and mirror it in its table row."""
        start = seq.num_computed_tokens
        plan.block_copies += self.block_manager.append(seq.block_table, start, end)
        self._queues.write_table(seq)

    def _append_placeholder(self, plan: StepPlan, seq: Sequence, chunk_index: int) -> None:
        seq.pending_step, seq.pending_row = plan.step_id, len(plan.rows)
        seq.token_ids.append(PLACEHOLDER)
        plan.rows.append(SampleRow(seq, len(seq.token_ids) - 1, chunk_index))
