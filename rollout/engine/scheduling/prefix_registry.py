"""The scheduler's side of the prefix cache: which of a sequence's blocks it offers, and when.

A sequence's full blocks of computed KV are offered (registered under the chain digest of their
tokens, block_manager.py) when its prompt's prefill is planned, when it is preempted and when it
ends: never per decode token, which would walk its whole block table every step. KV computed
under older weights (before the cache's epoch changed) is never offered.
"""

from __future__ import annotations

from rollout.engine.scheduling.block_manager import ROOT_DIGEST, block_digest
from rollout.engine.scheduling.sequence import PLACEHOLDER, Sequence


class PrefixRegistry:
    """Mixed into Scheduler (it reads the scheduler's block manager)."""

    def _register(self, seq: Sequence, end: int) -> None:
        """Offer seq's full blocks below position `end` (KV computed, tokens known) to the
        prefix cache, unless its KV predates the cache's epoch (older weights)."""
        if seq.cache_epoch != self.block_manager.cache_epoch:
            return
        num_blocks = min(end, len(seq.token_ids)) // self.block_manager.block_size
        self.block_manager.register(seq.block_table, self._block_digests(seq, num_blocks))

    def _block_digests(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The digests of seq's first num_blocks full blocks (fewer if one holds a token still
        on the device), each computed once."""
        digests, tokens, size = seq.block_digests, seq.token_ids, self.block_manager.block_size
        while len(digests) < num_blocks:
            block = tokens[len(digests) * size : (len(digests) + 1) * size]
            if PLACEHOLDER in block:
                break
            digests.append(block_digest(digests[-1] if digests else ROOT_DIGEST, block))
        return digests[:num_blocks]

    def reset_prefix_cache(self) -> None:
        """Forget the cached KV (the weights changed). Sequences running now keep theirs but
        never offer it to the cache."""
        self.block_manager.reset_cache()
