"""BlockManager: free list, reference counts, sharing and copy-on-write (pure host code)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rollout.engine.scheduling.block_manager import BlockManager


def assert_consistent(bm: BlockManager, tables: list[list[int]]) -> None:
    """Free list and reference counts agree with each other and with the live tables."""
    free = list(bm._free)
    assert len(set(free)) == len(free), "a block is on the free list twice"
    assert all(bm.ref_counts[b] == 0 for b in free), "a free block has references"
    assert bm.num_free_blocks + int(np.count_nonzero(bm.ref_counts > 0)) == bm.num_blocks
    assert np.all(bm.ref_counts >= 0)
    refs = np.zeros(bm.num_blocks, dtype=np.int64)
    for table in tables:
        for block in table:
            refs[block] += 1
    np.testing.assert_array_equal(bm.ref_counts, refs)
    assert int(bm.ref_counts.sum()) == sum(len(t) for t in tables)


# ---- examples ------------------------------------------------------------------------------------


def test_new_manager_has_every_block_free():
    bm = BlockManager(num_blocks=5, block_size=4)
    assert bm.num_free_blocks == 5
    assert not bm.ref_counts.any()
    assert [bm.num_blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 2)])
def test_rejects_empty_pools(num_blocks, block_size):
    with pytest.raises(AssertionError):
        BlockManager(num_blocks, block_size)


def test_append_grows_table_and_takes_blocks():
    bm = BlockManager(num_blocks=6, block_size=4)
    table: list[int] = []
    assert bm.num_new_blocks_needed(table, 0, 5) == 2
    assert bm.append(table, 0, 5) == []
    assert len(table) == 2 and len(set(table)) == 2
    assert bm.num_free_blocks == 4
    assert all(bm.ref_counts[b] == 1 for b in table)
    # Filling the partly used second block takes nothing; crossing into a third block takes one.
    assert bm.num_new_blocks_needed(table, 5, 8) == 0
    assert bm.append(table, 5, 8) == []
    assert len(table) == 2 and bm.num_free_blocks == 4
    assert bm.append(table, 8, 9) == []
    assert len(table) == 3 and bm.num_free_blocks == 3
    assert_consistent(bm, [table])


def test_writes_in_place_only_inside_an_own_unshared_partly_filled_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    table: list[int] = []
    bm.append(table, 0, 6)  # positions 0-5: a full block and a partly filled one
    assert bm.writes_in_place(table, 6)  # same block as position 5, owned alone
    assert not bm.writes_in_place(table, 8)  # a block boundary: a new block is needed
    for position in (6, 8):  # the general count agrees
        expected = bm.num_new_blocks_needed(table, position, position + 1) == 0
        assert bm.writes_in_place(table, position) == expected
    sibling = bm.share(table)  # a forked sample: the partly filled block is now shared
    assert not bm.writes_in_place(table, 6) and not bm.writes_in_place(sibling, 6)
    assert bm.num_new_blocks_needed(table, 6, 7) == 1  # copy-on-write


def test_empty_append_is_a_no_op():
    bm = BlockManager(num_blocks=2, block_size=2)
    table: list[int] = []
    bm.append(table, 0, 3)
    shared = bm.share(table)
    before = bm.ref_counts.copy()
    # start == end never copies, even into a shared partly filled block.
    assert bm.num_new_blocks_needed(shared, 3, 3) == 0
    assert bm.append(shared, 3, 3) == []
    assert shared == table
    np.testing.assert_array_equal(bm.ref_counts, before)


def test_append_without_room_raises_and_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=2)
    table: list[int] = []
    bm.append(table, 0, 4)
    assert bm.can_append(table, 4, 6)
    assert not bm.can_append(table, 4, 7)
    before_table, before_refs = list(table), bm.ref_counts.copy()
    with pytest.raises(RuntimeError, match="need 2 free KV blocks, have 1"):
        bm.append(table, 4, 7)
    assert table == before_table
    np.testing.assert_array_equal(bm.ref_counts, before_refs)
    assert bm.num_free_blocks == 1


def test_share_and_free_count_references():
    bm = BlockManager(num_blocks=4, block_size=4)
    parent: list[int] = []
    bm.append(parent, 0, 8)
    child = bm.share(parent)
    assert child == parent and child is not parent
    assert all(bm.ref_counts[b] == 2 for b in parent)
    assert bm.num_free_blocks == 2
    bm.free(parent)
    assert parent == []
    assert all(bm.ref_counts[b] == 1 for b in child)
    assert bm.num_free_blocks == 2
    bm.free(child)
    assert child == [] and bm.num_free_blocks == 4 and not bm.ref_counts.any()


def test_copy_on_write_of_shared_partly_filled_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent: list[int] = []
    bm.append(parent, 0, 5)  # one full block, one block holding 1 token
    full, partial = parent
    child_a, child_b = bm.share(parent), bm.share(parent)
    assert bm.ref_counts[full] == 3 and bm.ref_counts[partial] == 3

    # Writing position 5 into the shared partial block needs one new block (the copy).
    assert bm.num_new_blocks_needed(child_a, 5, 6) == 1
    copies = bm.append(child_a, 5, 6)
    assert len(copies) == 1
    src, dst = copies[0]
    assert src == partial and dst not in (full, partial)
    assert child_a == [full, dst]
    assert bm.ref_counts[full] == 3 and bm.ref_counts[partial] == 2 and bm.ref_counts[dst] == 1

    # A write that also crosses into a new block copies the shared one and grows.
    assert bm.num_new_blocks_needed(child_b, 5, 10) == 2
    copies = bm.append(child_b, 5, 10)
    assert [c[0] for c in copies] == [partial]
    assert child_b[0] == full and len(child_b) == 3
    assert bm.ref_counts[partial] == 1

    # The last holder of the partial block writes in place: no copy.
    assert bm.num_new_blocks_needed(parent, 5, 6) == 0
    assert bm.append(parent, 5, 6) == []
    assert parent == [full, partial]
    assert_consistent(bm, [parent, child_a, child_b])


def test_no_copy_when_the_shared_blocks_are_full():
    bm = BlockManager(num_blocks=4, block_size=4)
    parent: list[int] = []
    bm.append(parent, 0, 8)
    child = bm.share(parent)
    assert bm.append(child, 8, 9) == []
    assert child[:2] == parent and len(child) == 3
    assert all(bm.ref_counts[b] == 2 for b in parent)
    assert_consistent(bm, [parent, child])


def test_can_append_counts_the_copy_block():
    bm = BlockManager(num_blocks=2, block_size=4)
    parent: list[int] = []
    bm.append(parent, 0, 3)
    child = bm.share(parent)
    other: list[int] = []
    bm.append(other, 0, 1)  # takes the last free block
    assert bm.num_free_blocks == 0
    # Same block, no growth, but the block is shared: the copy needs a free block.
    assert bm.num_new_blocks_needed(child, 3, 4) == 1
    assert not bm.can_append(child, 3, 4)
    with pytest.raises(RuntimeError):
        bm.append(child, 3, 4)
    assert child == parent
    bm.free(other)
    assert bm.can_append(child, 3, 4)
    assert len(bm.append(child, 3, 4)) == 1
    assert_consistent(bm, [parent, child])


def test_double_free_is_caught():
    bm = BlockManager(num_blocks=2, block_size=2)
    table: list[int] = []
    bm.append(table, 0, 3)
    alias = list(table)
    bm.free(table)
    with pytest.raises(AssertionError, match="double free"):
        bm.free(alias)


def test_sharing_a_free_block_is_caught():
    bm = BlockManager(num_blocks=2, block_size=2)
    with pytest.raises(AssertionError, match="sharing free block"):
        bm.share([1])


def test_freed_blocks_are_reused():
    bm = BlockManager(num_blocks=3, block_size=1)
    a: list[int] = []
    bm.append(a, 0, 3)
    assert bm.num_free_blocks == 0
    bm.free(a)
    b: list[int] = []
    bm.append(b, 0, 3)
    assert sorted(b) == [0, 1, 2]
    assert_consistent(bm, [b])


# ---- properties ----------------------------------------------------------------------------------


class _Table:
    """A live block table with the token count it holds and the token values it should read back."""

    def __init__(self, blocks: list[int], values: list[int]) -> None:
        self.blocks = blocks
        self.values = values


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate/append/share/free, with a simulated KV memory to check copy-on-write."""

    @initialize(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4))
    def setup(self, num_blocks, block_size):
        self.bm = BlockManager(num_blocks, block_size)
        self.live: list[_Table] = []
        self.memory = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self.next_value = 0

    def _write(self, table: _Table, start: int, end: int) -> None:
        """What the device does: block copies first, then the new tokens."""
        can = self.bm.can_append(table.blocks, start, end)
        needed = self.bm.num_new_blocks_needed(table.blocks, start, end)
        assert can == (needed <= self.bm.num_free_blocks)
        free_before = self.bm.num_free_blocks
        if not can:
            before_blocks, before_refs = list(table.blocks), self.bm.ref_counts.copy()
            with pytest.raises(RuntimeError):
                self.bm.append(table.blocks, start, end)
            assert table.blocks == before_blocks
            np.testing.assert_array_equal(self.bm.ref_counts, before_refs)
            return
        copies = self.bm.append(table.blocks, start, end)
        assert self.bm.num_free_blocks == free_before - needed
        assert len(copies) <= 1
        for src, dst in copies:
            assert src != dst and self.bm.ref_counts[dst] == 1 and self.bm.ref_counts[src] >= 1
            self.memory[dst] = self.memory[src]
        bs = self.bm.block_size
        for pos in range(start, end):
            block = table.blocks[pos // bs]
            # Never write into a block someone else still reads.
            assert self.bm.ref_counts[block] == 1
            self.memory[block, pos % bs] = self.next_value
            table.values.append(self.next_value)
            self.next_value += 1

    @rule(num_tokens=st.integers(1, 10))
    def allocate(self, num_tokens):
        table = _Table([], [])
        self._write(table, 0, num_tokens)
        if table.values:
            self.live.append(table)
        else:  # did not fit: nothing was taken
            assert table.blocks == []

    @precondition(lambda self: self.live)
    @rule(data=st.data(), num_tokens=st.integers(1, 6))
    def extend(self, data, num_tokens):
        table = data.draw(st.sampled_from(self.live))
        n = len(table.values)
        self._write(table, n, n + num_tokens)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live))
        child = _Table(self.bm.share(parent.blocks), list(parent.values))
        assert child.blocks == parent.blocks
        assert all(self.bm.ref_counts[b] >= 2 for b in parent.blocks)
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        table = data.draw(st.sampled_from(self.live))
        blocks = list(table.blocks)
        before = self.bm.ref_counts.copy()
        self.bm.free(table.blocks)
        assert table.blocks == []
        expected = before.copy()
        for b in blocks:
            expected[b] -= 1
        np.testing.assert_array_equal(self.bm.ref_counts, expected)
        self.live.remove(table)

    @invariant()
    def consistent(self):
        if not hasattr(self, "bm"):
            return
        assert_consistent(self.bm, [t.blocks for t in self.live])
        bs = self.bm.block_size
        for t in self.live:
            assert len(t.blocks) == self.bm.num_blocks_for(len(t.values))
            read = [int(self.memory[t.blocks[p // bs], p % bs]) for p in range(len(t.values))]
            assert read == t.values, "a sharer's tokens were overwritten (copy-on-write broken)"

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for t in list(self.live):
            self.bm.free(t.blocks)
        assert self.bm.num_free_blocks == self.bm.num_blocks
        assert not self.bm.ref_counts.any()


BlockManagerMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_block_manager_state_machine = BlockManagerMachine.TestCase
