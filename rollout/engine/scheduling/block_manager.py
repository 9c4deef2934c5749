"""KV-cache block bookkeeping: a free list, reference counts and block tables. No torch here.

A block table is a plain list of block ids owned by one sequence. Blocks are shared by reference
count (the G samples of a prompt share its prompt blocks); a shared block that is about to be
written is copied first (copy-on-write), and the copy is returned for the device to perform.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = np.zeros(num_blocks, dtype=np.int32)
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

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
        return self.num_new_blocks_needed(block_table, start, end) <= len(self._free)

    def append(self, block_table: list[int], start: int, end: int) -> list[tuple[int, int]]:
        """Make positions [start, end) writable: copy a shared first block, grow the table.

        Mutates `block_table`; returns the (src, dst) block copies the device must do first.
        """
        needed = self.num_new_blocks_needed(block_table, start, end)
        if needed > len(self._free):
            raise RuntimeError(f"need {needed} free KV blocks, have {len(self._free)}")
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
        block = self._free.popleft()
        assert self.ref_counts[block] == 0, f"free block {block} has references"
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"double free of block {block}"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)
