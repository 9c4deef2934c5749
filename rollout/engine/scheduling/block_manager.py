"""KV-cache block bookkeeping: a free list, reference counts and block tables. No torch here.

A block table is a plain list of block ids owned by one sequence. Blocks are shared by reference
count (the G samples of a prompt share its prompt blocks); a shared block that is about to be
written is copied first (copy-on-write), and the copy is returned for the device to perform.

Prefix cache: a full block whose KV is computed can be registered under a digest of its tokens
and of everything before it (a chain of 128-bit BLAKE2 digests, so equal digests mean equal
prefixes). When its last reference goes, a registered block is kept, evictable, instead of
freed; a request whose leading blocks match reuses them instead of computing them again (a new
turn of a conversation, prompts with a shared system prefix, a preempted sequence readmitted).
Evictable blocks are reused least recently released first, after the plainly free ones.
`reset_cache()` forgets every digest: the engine calls it when the weights change, since cached
KV was computed with the old ones.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

import numpy as np

ROOT_DIGEST = b""


def block_digest(previous: bytes, tokens) -> bytes:
    """The digest of a full block of `tokens` that follows the prefix with digest `previous`."""
    return hashlib.blake2b(previous + array("q", tokens).tobytes(), digest_size=16).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = np.zeros(num_blocks, dtype=np.int32)
        self._free: deque[int] = deque(range(num_blocks))
        self._digest: list[bytes | None] = [None] * num_blocks
        self._by_digest: dict[bytes, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered, no references
        self.cache_epoch = 0
        """Bumped by reset_cache(): KV computed in an older epoch must not be registered."""

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_digest)

    # ---- prefix cache ---------------------------------------------------------------------------

    def match_prefix(self, digests: list[bytes]) -> list[int]:
        """The registered blocks holding a sequence's leading blocks of these digests, up to the
        first miss (no references taken: `adopt` takes them)."""
        blocks: list[int] = []
        for digest in digests:
            block = self._by_digest.get(digest)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of these blocks adopting them takes out of the free count."""
        return sum(1 for b in blocks if self.ref_counts[b] == 0)

    def adopt(self, block_table: list[int], blocks: list[int]) -> None:
        """Start an empty table with matched prefix blocks (one reference each)."""
        assert not block_table
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self._evictable[block]
            self.ref_counts[block] += 1
            block_table.append(block)

    def register(self, block_table: list[int], digests: list[bytes]) -> None:
        """Register the table's first len(digests) blocks (full, their KV computed) under their
        digests. A block equal to one registered already stays unregistered (one copy is
        enough)."""
        for block, digest in zip(block_table, digests, strict=False):
            if self._digest[block] is None and digest not in self._by_digest:
                self._digest[block] = digest
                self._by_digest[digest] = block

    def reset_cache(self) -> None:
        """Forget every registered block (evictable ones become plainly free)."""
        for block in self._by_digest.values():
            self._digest[block] = None
        self._by_digest.clear()
        self._free.extend(self._evictable)
        self._evictable.clear()
        self.cache_epoch += 1

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks_needed(self, block_table: list[int], start: int, end: int) -> int:
        """Blocks to take from the free list so that positions [start, end) can be written."""
        assert 0 <= start <= end and len(block_table) >= self.num_blocks_for(start)
        grow = max(0, self.num_blocks_for(end) - len(block_table))
        return grow + (1 if self._needs_copy(block_table, start, end) else 0)

    def writes_in_place(self, block_table: list[int], position: int) -> bool:
        """Whether the token at `position` goes into the table's own, unshared, partly filled last
        block: nothing to take or copy. The common decode case, checked per sequence per step,
        so it skips the general count above."""
        return (
            position % self.block_size != 0
            and self.ref_counts[block_table[position // self.block_size]] == 1
        )

    def can_append(self, block_table: list[int], start: int, end: int) -> bool:
        return self.num_new_blocks_needed(block_table, start, end) <= self.num_free_blocks

    def append(self, block_table: list[int], start: int, end: int) -> list[tuple[int, int]]:
        """Make positions [start, end) writable: copy a shared first block, grow the table.

        Mutates `block_table`; returns the (src, dst) block copies the device must do first.
        """
        needed = self.num_new_blocks_needed(block_table, start, end)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"need {needed} free KV blocks, have {self.num_free_blocks}")
        copies = []
        if self._needs_copy(block_table, start, end):
            i = start // self.block_size
            src = block_table[i]
            dst = self._take()
            self._release(src)
            block_table[i] = dst
            copies.append((src, dst))
        while len(block_table) < self.num_blocks_for(end):
            block_table.append(self._take())
        return copies

    def share(self, block_table: list[int]) -> list[int]:
        """A new table referencing the same blocks (a forked sample)."""
        for block in block_table:
            assert self.ref_counts[block] > 0, f"sharing free block {block}"
            self.ref_counts[block] += 1
        return list(block_table)

    def truncate(self, block_table: list[int], num_blocks: int) -> None:
        """Drop the table's blocks past its first num_blocks (a verification's rejected drafts)."""
        while len(block_table) > num_blocks:
            self._release(block_table.pop())

    def free(self, block_table: list[int]) -> None:
        """Drop one reference to each block of the table and empty it."""
        for block in reversed(block_table):
            self._release(block)
        block_table.clear()

    def _needs_copy(self, block_table: list[int], start: int, end: int) -> bool:
        # Only the block holding `start` can be both already present and partly filled: blocks past
        # it are new, blocks before it are not written.
        i = start // self.block_size
        return end > start and i < len(block_table) and self.ref_counts[block_table[i]] > 1

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:  # evict the registered block released longest ago
            block, _ = self._evictable.popitem(last=False)
            del self._by_digest[self._digest[block]]
            self._digest[block] = None
        assert self.ref_counts[block] == 0, f"free block {block} has references"
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"double free of block {block}"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self._digest[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)
