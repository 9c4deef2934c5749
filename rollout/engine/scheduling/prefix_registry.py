"""The scheduler's side of the prefix cache: which of a sequence's blocks it offers, and when.

A sequence's full blocks of computed KV are offered (registered under the chain digest of their
tokens, block_manager.py) when its prompt's prefill is planned, when it is preempted and when it
ends: never per decode token, which would walk its whole block table every step. KV computed
under older weights (before the cache's epoch changed) is never offered.
"""

from __future__ import annotations

from rollout.engine.scheduling.block_manager import ROOT_DIGEST, BlockManager, block_digest
from rollout.engine.scheduling.sequence import PLACEHOLDER, Sequence


class PrefixRegistry:
    """What the scheduler offers to and asks of the block manager's prefix cache. Disabled, it
    offers nothing and matches nothing, so the scheduler calls it the same way either way."""

    def __init__(self, block_manager: BlockManager, enabled: bool) -> None:
        self.block_manager = block_manager
        self.enabled = enabled

    def match(self, seq: Sequence) -> list[int]:
        """The cached blocks holding seq's leading full blocks, for its admission (its last
        token is always left to compute: the step needs its logits)."""
        if not self.enabled:
            return []
        bm = self.block_manager
        return bm.match_prefix(self._digests(seq, (seq.num_tokens - 1) // bm.block_size))

    def register(self, seq: Sequence, end: int) -> None:
        """Offer seq's full blocks below position `end` (KV computed, tokens known) to the
        prefix cache, unless its KV predates the cache's epoch (older weights)."""
        if not self.enabled or seq.cache_epoch != self.block_manager.cache_epoch:
            return
        num_blocks = min(end, len(seq.token_ids)) // self.block_manager.block_size
        self.block_manager.register(seq.block_table, self._digests(seq, num_blocks))

    def register_prefills(self, prefills: list[tuple[Sequence, int]]) -> None:
        """Offer the blocks of a planned step's completed prefills ((sequence, end) each).
        Called once the step is planned, so only later steps (ordered after it on the device)
        can match them."""
        for seq, end in prefills:
            self.register(seq, end)

    def reset(self) -> None:
        """Forget the cached KV (the weights changed). Sequences running now keep theirs but
        never offer it to the cache."""
        self.block_manager.reset_cache()

    def _digests(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The digests of seq's first num_blocks full blocks (fewer if one holds a token still
        on the device), each computed once."""
        digests, tokens, size = seq.block_digests, seq.token_ids, self.block_manager.block_size
        while len(digests) < num_blocks:
            block = tokens[len(digests) * size : (len(digests) + 1) * size]
            if PLACEHOLDER in block:
                break
            digests.append(block_digest(digests[-1] if digests else ROOT_DIGEST, block))
        return digests[:num_blocks]
