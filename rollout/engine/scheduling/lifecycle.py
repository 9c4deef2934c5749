"""What forking, preempting and finishing do to a sequence: its blocks, its queue and block-table
row, and what it offers the prefix cache. The Scheduler decides when; this module says how, so
each change of state happens in one place. No torch here."""

from __future__ import annotations

from rollout.engine.scheduling.block_manager import BlockManager
from rollout.engine.scheduling.prefix_registry import PrefixRegistry
from rollout.engine.scheduling.queues import SequenceQueues
from rollout.engine.scheduling.sequence import Sequence, Status

FIRST_FORKED_SEQ_ID = 1_000_000_000
"""Forked samples' ids count up from here; requests use small ids."""


class SequenceLifecycle:
    def __init__(
        self,
        block_manager: BlockManager,
        queues: SequenceQueues,
        prefix: PrefixRegistry,
        max_model_len: int,
    ) -> None:
        self.block_manager = block_manager
        self.queues = queues
        self.prefix = prefix
        self.max_model_len = max_model_len
        self._last_seq_id = FIRST_FORKED_SEQ_ID

    def token_limit(self, seq: Sequence) -> int:
        """The length seq ends at, prompt included: its sample's own length (`sample_lengths`)
        or `max_tokens`, within the model's context."""
        lengths = seq.params.sample_lengths
        new = lengths[seq.sample_index] if lengths else seq.params.max_tokens
        return min(seq.num_prompt_tokens + new, self.max_model_len)

    def new_sample(self, parent: Sequence, sample_index: int, status: Status) -> Sequence:
        """Another sample of parent's group, with no blocks yet."""
        self._last_seq_id += 1
        child = parent.sibling(self._last_seq_id, sample_index, status)
        child.token_limit = self.token_limit(child)
        return child

    def fork(self, parent: Sequence, sample_index: int) -> Sequence:
        """A further sample of a group whose prompt was just computed: it shares the prompt's
        blocks and runs from the next step."""
        assert (
            parent.num_output_tokens == 1 and parent.num_computed_tokens == parent.num_prompt_tokens
        )
        child = self.new_sample(parent, sample_index, status=Status.RUNNING)
        child.num_computed_tokens = parent.num_computed_tokens
        child.block_table = self.block_manager.share(parent.block_table)
        self.queues.run(child, shares_table_of=parent)
        return child

    def preempt(self, seq: Sequence) -> None:
        """Back to waiting with no blocks: its KV is recomputed when it is admitted again (and
        may come from the prefix cache then)."""
        self.queues.leave(seq)
        self.prefix.register(seq, seq.num_computed_tokens)
        self.block_manager.free(seq.block_table)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.queues.wait(seq)

    def finish(self, seq: Sequence, reason: str, keep: int) -> None:
        """End seq with its first `keep` tokens (a token past the end, in flight when it
        stopped, is dropped) and give its blocks back."""
        if seq.block_table:
            self.prefix.register(seq, min(seq.num_computed_tokens, keep))
        self.queues.leave(seq)
        self.block_manager.free(seq.block_table)
        del seq.token_ids[keep:]
        del seq.logprobs[keep - seq.num_prompt_tokens :]
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.pending_step = seq.pending_row = -1
