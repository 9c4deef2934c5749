"""The scheduler's two queues and the running sequences' block-table rows. No torch here.

Both queues are kept oldest first (arrival, then sequence id): running sequences are scheduled
and waiting ones admitted in that order, and the newest running one is the first preempted.

Each running sequence owns one row of `table_rows`, a numpy mirror of its block table written
only when the table changes (every block_size tokens), so a step gathers its tables in one
indexing operation (step_inputs.py).
"""

from __future__ import annotations

import bisect

import numpy as np

from rollout.engine.scheduling.sequence import Sequence, Status


class SequenceQueues:
    """Which sequences wait and which run, in age order; a running sequence's table row. The
    scheduler decides who moves; this keeps the queues, rows and mirror consistent."""

    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int) -> None:
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.table_rows = np.zeros((max_num_seqs, max_blocks_per_seq), dtype=np.int32)
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))

    def wait(self, seq: Sequence) -> None:
        """seq joins the waiting queue (a new request, or a preempted sequence to recompute)."""
        _insort(self.waiting, seq)

    def run(self, seq: Sequence, shares_table_of: Sequence | None = None) -> None:
        """seq joins the running queue with a table row of its own: its block table written, or
        for a sample forked from `shares_table_of`, whose blocks it shares, that row copied."""
        seq.table_row = self._free_rows.pop()
        if shares_table_of is None:
            self.write_table(seq)
        else:
            self.table_rows[seq.table_row] = self.table_rows[shares_table_of.table_row]
        _insort(self.running, seq)

    def write_table(self, seq: Sequence) -> None:
        """Mirror a running sequence's block table after it changed."""
        self.table_rows[seq.table_row, : len(seq.block_table)] = seq.block_table

    def leave(self, seq: Sequence) -> None:
        """seq leaves whichever queue its status puts it in (a running one gives its row back)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            assert seq.table_row >= 0, "a running sequence owns a table row"
            self._free_rows.append(seq.table_row)
            seq.table_row = -1
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)


def _insort(queue: list[Sequence], seq: Sequence) -> None:
    bisect.insort(queue, seq, key=_age)


def _age(seq: Sequence) -> tuple[int, int]:
    return (seq.arrival, seq.seq_id)
