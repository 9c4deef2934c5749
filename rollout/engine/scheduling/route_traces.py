"""Each sequence's recorded routes, position by position, as the steps' results come in.

A step's routes are one row per input token (rollout/engine/model/route_recording.py); the
chunk of a sequence that fed positions [start, start + n) owns n consecutive rows. A write at
`start` drops whatever the trace held from `start` on, so the trace always describes the KV the
sequence's next tokens attend to: a recompute after preemption rewrites from 0, and the rows of
rejected draft tokens go when the next chunk starts after the accepted ones. The samples forked
off a group's prompt take a copy of the prompt's routes when that prompt's last chunk is in.
"""

from __future__ import annotations

import numpy as np

from rollout.engine.scheduling.step_plan import StepPlan


class RouteTrace:
    """Routes of one sequence's positions [0, length), in a buffer grown by doubling."""

    def __init__(self, row_shape: tuple[int, int], dtype: np.dtype) -> None:
        self.rows = np.empty((0, *row_shape), dtype=dtype)
        self.length = 0

    def write(self, start: int, rows: np.ndarray) -> None:
        assert start <= self.length, "routes are written in position order"
        end = start + len(rows)
        if end > len(self.rows):
            grown = np.empty(
                (max(end, 2 * len(self.rows), 64), *self.rows.shape[1:]), self.rows.dtype
            )
            grown[:start] = self.rows[:start]
            self.rows = grown
        self.rows[start:end] = rows
        self.length = end

    def take(self, length: int) -> np.ndarray:
        """A copy of the first `length` positions' routes (fewer if fewer were computed)."""
        return self.rows[: min(length, self.length)].copy()


def record_step_routes(plan: StepPlan, routes: np.ndarray) -> None:
    """File one step's routes [num_tokens, num_routers, top_k] under its sequences. Called
    before the step's tokens are processed; a sequence that ended in an earlier step (the
    overlap loop's extra token) is skipped."""
    row_shape, dtype = routes.shape[1:], routes.dtype
    offset = 0
    for chunk in plan.chunks:
        n = len(chunk.token_ids)
        seq = chunk.seq
        if not seq.is_finished:
            if seq.routes is None:
                seq.routes = RouteTrace(row_shape, dtype)
            seq.routes.write(chunk.start, routes[offset : offset + n])
        offset += n
    for row in plan.rows:
        chunk = plan.chunks[row.chunk_index]
        if row.seq is not chunk.seq and row.seq.routes is None:  # forked off this prompt
            row.seq.routes = RouteTrace(row_shape, dtype)
            row.seq.routes.write(0, chunk.seq.routes.take(chunk.start + len(chunk.token_ids)))
