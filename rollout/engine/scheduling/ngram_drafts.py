"""Draft tokens for speculative decoding from n-grams already seen in the sample's group.

A GRPO group's samples share their prompt and often their reasoning, so the tokens that followed
the last n tokens somewhere in the prompt, in the sample itself or in a sibling are a cheap guess
of what comes next. The group keeps one index from each n-gram (MIN_N .. MAX_N tokens) to the
place its most recent occurrence was followed; it is brought up to date only with the tokens
appended since the last look (host work per step grows with new tokens, not with lengths), and
only while the engine speculates.

The drafts are proposals, not samples: the verification step (speculation.py) keeps a draft token
only when it is the token the plain sampler draws at that position, so drafts change how many
tokens a forward yields, never which tokens come out.
"""

from __future__ import annotations

from rollout.engine.scheduling.sequence import PLACEHOLDER, Sequence

MIN_N = 2
MAX_N = 4


class GroupNgrams:
    """The n-gram index of one group (the samples of one request). Shared by its Sequences."""

    def __init__(self) -> None:
        self.members: list[Sequence] = []
        """The group's samples (the scheduler adds each as it is created)."""
        self._next: dict[tuple[int, ...], tuple[Sequence, int]] = {}
        """n-gram -> (sequence, index of the token that followed it there)."""
        self._indexed: dict[int, int] = {}
        """seq_id -> how many of its positions have been indexed as n-gram ends."""

    def propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        """Up to max_tokens draft tokens to follow seq's current tokens ([] when none is found)."""
        if max_tokens <= 0:
            return []
        for member in self.members:  # finished siblings too: their tokens are the best guesses
            self._catch_up(member)
        tokens = seq.token_ids
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(tokens) < n:
                continue
            hit = self._next.get(tuple(tokens[-n:]))
            if hit is None:
                continue
            source, start = hit
            draft = source.token_ids[start : start + max_tokens]
            if PLACEHOLDER in draft:
                draft = draft[: draft.index(PLACEHOLDER)]
            if draft:
                return draft
        return []

    def _catch_up(self, seq: Sequence) -> None:
        """Index every n-gram of seq that ends before its last token (its continuation is known)."""
        tokens = seq.token_ids
        if seq.seq_id not in self._indexed and self._indexed:
            # A sibling: the shared prompt is indexed already (through the first sample).
            start = max(0, seq.num_prompt_tokens - MAX_N)
        else:
            start = self._indexed.get(seq.seq_id, 0)
        end = len(tokens) - 1  # the last token's continuation is what we are drafting
        while end > start and tokens[end] == PLACEHOLDER:
            end -= 1
        index = self._next
        for i in range(start, end):  # n-grams ending at i, followed by tokens[i + 1]
            if tokens[i + 1] == PLACEHOLDER:
                break
            for n in range(MIN_N, MAX_N + 1):
                if i + 1 >= n:
                    index[tuple(tokens[i + 1 - n : i + 1])] = (seq, i + 1)
        self._indexed[seq.seq_id] = max(start, end)
