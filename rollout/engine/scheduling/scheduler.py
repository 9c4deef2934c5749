"""Continuous batching: which sequences run in the next step, and with how many tokens. No torch here.

Each step gets a token budget. Running sequences go first, oldest first (a decode costs one token, an
unfinished prefill continues with a chunk); waiting sequences are then admitted in arrival order
while the budget, the sequence cap and the free blocks allow (a sequence is admitted only when all
of its tokens fit, with one block of headroom per running sequence). When a running sequence cannot
get a block, the newest running sequence not yet in this step is preempted (its blocks freed,
recomputed later); if none is left, the sequence preempts itself. Since every admitted sequence
fits alone in the cache, the oldest one always progresses: no deadlock.

`schedule()` advances host state at once, as if the step had already run: computed-token counts go
up and each sampled token is a PLACEHOLDER until `process_results()` fills it. So the next step can
be scheduled while this one is still on the device (the overlap loop); its inputs name the
placeholders they need through `carry_row` (the previous step's sampler row).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from rollout.engine.scheduling.block_manager import BlockManager
from rollout.engine.scheduling.lifecycle import SequenceLifecycle
from rollout.engine.scheduling.plan_writer import PlanWriter
from rollout.engine.scheduling.prefix_registry import PrefixRegistry
from rollout.engine.scheduling.queues import SequenceQueues
from rollout.engine.scheduling.sequence import PLACEHOLDER, Sequence, Status
from rollout.engine.scheduling.speculation import Speculation
from rollout.engine.scheduling.step_plan import StepPlan


class Scheduler:
    """The queues and the decisions: which sequence is admitted, runs, is preempted or ends, and
    when. How a sequence forks, is preempted or finishes is lifecycle.py's, how a decision is
    written into the step's plan plan_writer.py's; speculation
    (speculation.py) and the prefix registry (prefix_registry.py) are objects it holds: they get
    what they need as arguments and never end or preempt a sequence themselves."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
        speculative_tokens: int = 0,
        speculative_max_seqs: int = 0,
        speculation_max_pause: int = 64,
        stop_string_hit: Callable[[Sequence], bool] | None = None,
        prefix_caching: bool = False,
    ) -> None:
        """`speculative_tokens`: the most drafts one verification checks (0: no speculation),
        while at most `speculative_max_seqs` sequences run, and after tries that gained
        nothing at most `speculation_max_pause` steps between tries (0: try every step; all
        three are Speculation's, speculation.py). `stop_string_hit`: whether a sequence's output
        now contains one of its `params.stop` strings (the engine's detokenizing check; None: no
        tokenizer). `prefix_caching`: reuse the cached KV of a request's leading full blocks
        (block_manager.py)."""
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.stop_string_hit = stop_string_hit
        self.num_preemptions = 0
        self.num_prefix_hit_tokens = 0
        """Tokens whose KV came from the prefix cache instead of being computed."""
        self.speculation = Speculation(
            block_manager,
            speculative_tokens,
            speculative_max_seqs,
            speculation_max_pause,
            end_reason=self._end_reason,
        )
        self._prefix = PrefixRegistry(block_manager, prefix_caching)
        self._next_step = 0
        self._queues = SequenceQueues(max_num_seqs, -(-max_model_len // block_manager.block_size))
        self._lifecycle = SequenceLifecycle(
            block_manager, self._queues, self._prefix, max_model_len
        )
        self._writer = PlanWriter(self._lifecycle)

    @property
    def waiting(self) -> list[Sequence]:
        return self._queues.waiting

    @property
    def running(self) -> list[Sequence]:
        return self._queues.running

    @property
    def table_rows(self) -> np.ndarray:
        """The running sequences' block tables, a row each (queues.py)."""
        return self._queues.table_rows

    def wants_speculation(self) -> bool:
        """Whether the next step verifies drafts where it can (Speculation.wants)."""
        return self.speculation.wants(len(self.running), self._next_step)

    # ---- requests -------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        assert seq.status is Status.WAITING and not seq.block_table
        seq.token_limit = self._lifecycle.token_limit(seq)
        self.speculation.prepare(seq)
        self._queues.wait(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sequence of the request with reason "abort"; returns them."""
        hits = [s for s in (*self.running, *self.waiting) if s.request_id == request_id]
        unforked = []
        for seq in hits:
            # Samples not forked yet (the prompt is still being computed) end here too.
            for j in range(1, seq.num_forks_pending + 1):
                sample = self._lifecycle.new_sample(seq, seq.sample_index + j, Status.FINISHED)
                sample.finish_reason = "abort"
                unforked.append(sample)
            seq.num_forks_pending = 0
            self._lifecycle.finish(seq, "abort", keep=seq.num_resolved_tokens)
        return hits + unforked

    def reset_prefix_cache(self) -> None:
        """Forget the cached KV (the weights changed). Sequences running now keep theirs but
        never offer it to the cache."""
        self._prefix.reset()

    # ---- one step -------------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """Pick the next step's work and advance host state; None when nothing can run now."""
        plan = StepPlan(self._next_step, [], [], [], 0)
        in_step: set[int] = set()  # seq_ids in the plan: not to be preempted for room
        budget = self._schedule_running(plan, in_step)
        # Admissions only when this step did not preempt (the cache is full: admitting now would
        # only churn, and a just-preempted sequence may still wait for its in-flight token).
        if plan.num_preempted == 0:
            self._admit(plan, budget)
        if not plan.chunks:
            return None
        self._prefix.register_prefills(plan.completed_prefills)
        self._next_step += 1
        return plan

    def _schedule_running(self, plan: StepPlan, in_step: set[int]) -> int:
        """The running sequences' chunks, oldest first: a decode token, a prefill's next chunk,
        or a verification of drafts. Returns the token budget left for admissions."""
        budget = self.max_num_batched_tokens
        chunks = plan.chunks
        writes_in_place = self.block_manager.writes_in_place
        running = Status.RUNNING
        speculate = self.wants_speculation()
        add_decode_token = self._writer.add_decode_token  # bound once: the hot path
        drafted = False  # whether a sequence was looked up for drafts
        for seq in list(self.running):  # a snapshot: preemption edits the list
            if budget == 0 or len(chunks) == self.max_num_seqs:
                break
            num_tokens = len(seq.token_ids)
            if seq.status is not running or num_tokens >= seq.token_limit:
                continue  # preempted just now, or its last token is in flight
            start = seq.num_computed_tokens
            assert start < num_tokens, "a verification's results must be in before the next step"
            if (
                speculate
                and num_tokens - start == 1
                and num_tokens > seq.num_prompt_tokens  # decoding, not a prompt's last token
                and seq.token_ids[-1] != PLACEHOLDER
            ):
                drafted = True
                used = self._schedule_verification(plan, seq, budget, in_step)
                if used is not None:
                    budget -= used
                    continue
            num_new = min(num_tokens - start, budget)
            if num_new == 1 and writes_in_place(seq.block_table, start):
                # A generated token and the last one: not a recompute's chunk the budget cut to 1
                if start >= len(seq.prompt_token_ids) and num_tokens == start + 1:
                    add_decode_token(plan, seq, start)  # the common case, kept short
                    budget -= 1
                    in_step.add(seq.seq_id)
                    continue
                needed = 0  # a decode token into its own block: no room to make
            else:
                needed = self._make_room(seq, num_new, in_step, plan)
                if needed < 0:
                    continue
            budget -= self._writer.add_chunk(plan, seq, num_new, needed)
            in_step.add(seq.seq_id)
        if drafted and not plan.speculative:
            self.speculation.tried(plan.step_id, gained=False)  # no draft found
        return budget

    def _schedule_verification(
        self, plan: StepPlan, seq: Sequence, budget: int, in_step: set[int]
    ) -> int | None:
        """A verification of seq's drafts if there are any: returns the tokens it takes (0 when
        making room preempted seq itself), or None when there is no draft (a plain decode)."""
        draft = self.speculation.draft(seq, budget)
        if not draft:
            return None
        end = seq.num_computed_tokens + 1 + len(draft)
        needed = self._make_room(seq, 1 + len(draft), in_step, plan)
        if needed < 0:
            return 0
        if needed:
            self._writer.grow(plan, seq, end)
        in_step.add(seq.seq_id)
        return self.speculation.add_verification(plan, seq, draft)

    def _admit(self, plan: StepPlan, budget: int) -> None:
        """Waiting sequences in arrival order, while the budget, the sequence cap and the free
        blocks allow."""
        bm = self.block_manager
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(plan.chunks) == self.max_num_seqs or (
                len(self.running) + 1 + seq.num_forks_pending > self.max_num_seqs
            ):
                break
            hits = self._prefix.match(seq)  # leading blocks whose KV is cached
            # Admit only what fits whole (every chunk of its prompt, or of its recompute after a
            # preemption) with a block of growth left for each running sequence. Otherwise a
            # recompute admitted into a full cache is preempted again a few steps later, its
            # prefill thrown away, over and over: the cache churns and nothing finishes.
            whole = bm.num_blocks_for(seq.num_tokens) - len(hits) + bm.num_evictable(hits)
            if whole + len(self.running) > bm.num_free_blocks:
                break
            self._queues.leave(seq)
            budget -= self._start_running(plan, seq, hits, budget)

    def _start_running(self, plan: StepPlan, seq: Sequence, hits: list[int], budget: int) -> int:
        """Admit seq with the cached blocks `hits` as its leading blocks, and its first chunk
        in the plan; returns the chunk's token count."""
        bm = self.block_manager
        bm.adopt(seq.block_table, hits)
        cached = len(hits) * bm.block_size
        seq.num_computed_tokens = cached
        self.num_prefix_hit_tokens += cached
        seq.cache_epoch = bm.cache_epoch
        num_new = min(seq.num_tokens - cached, budget)
        needed = bm.num_new_blocks_needed(seq.block_table, cached, cached + num_new)
        seq.status = Status.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        self._queues.run(seq)
        return self._writer.add_chunk(plan, seq, num_new, needed)

    def process_results(
        self, plan: StepPlan, token_ids: np.ndarray, logprobs: np.ndarray
    ) -> list[Sequence]:
        """Fill the plan's placeholders with sampled tokens; returns sequences that finished."""
        finished = []
        step_id, finished_status = plan.step_id, Status.FINISHED
        speculation = self.speculation
        accepted_before = speculation.stats.accepted
        # Python lists: per-element access to numpy arrays would build a scalar object each time.
        for sample, token, logprob in zip(
            plan.rows, token_ids.tolist(), logprobs.tolist(), strict=True
        ):
            seq = sample.seq
            if seq.status is finished_status:  # stopped a step earlier: its extra token is dropped
                continue
            position = sample.position
            if sample.draft_index >= 0:
                reason = speculation.verify(plan, sample, token, logprob)
            else:
                assert seq.token_ids[position] == PLACEHOLDER, "sampled row without a placeholder"
                seq.token_ids[position] = token
                seq.logprobs.append(logprob)
                if seq.pending_step == step_id:
                    seq.pending_step = seq.pending_row = -1
                reason = self._end_reason(seq, token, position)
            if reason is None:
                continue
            self._lifecycle.finish(seq, reason, keep=position + 1)
            finished.append(seq)
        if plan.speculative:
            speculation.tried(step_id, gained=speculation.stats.accepted > accepted_before)
        return finished

    def _end_reason(self, seq: Sequence, token: int, position: int) -> str | None:
        """Why the sample ends with `token` at `position` ("stop", "length"), or None."""
        params = seq.params
        if token in params.stop_token_ids or (
            not params.ignore_eos and token in self.eos_token_ids
        ):
            return "stop"
        if params.stop and self.stop_string_hit(seq):
            return "stop"
        if position + 1 >= seq.token_limit:
            return "length"
        return None

    # ---- helpers ----------------------------------------------------------------------------

    def _make_room(self, seq: Sequence, num_new: int, in_step: set[int], plan: StepPlan) -> int:
        """Preempt newer sequences until `seq` can take its blocks. Returns how many blocks it
        needs, or -1 if `seq` itself had to go."""
        start = seq.num_computed_tokens
        bm = self.block_manager
        needed = bm.num_new_blocks_needed(seq.block_table, start, start + num_new)
        while needed > bm.num_free_blocks:
            victim = next((s for s in reversed(self.running) if s.seq_id not in in_step), None)
            assert victim is not None, "the sequence itself is always a candidate"
            self._lifecycle.preempt(victim)
            self.num_preemptions += 1
            plan.num_preempted += 1
            if victim is seq:
                return -1
            # Freeing a sibling can leave seq the sole owner of a shared block: recount.
            needed = bm.num_new_blocks_needed(seq.block_table, start, start + num_new)
        return needed
