"""The weights' way from the trainer to the rollout pool, in both modes: the pool's broadcast, then
a logprob parity probe (`parity.py`). It follows AsyncGRPOTrainer's weight-transfer protocol,
which the streaming trainer drives itself; in sync mode `sync.WeightsBeforeGeneration` drives it
before each generation that follows an optimizer step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class PoolWeightTransfer:
    """AsyncGRPOTrainer's weight transfer: the pool's broadcast, then a logprob parity probe."""

    def __init__(
        self, pool, parity_check: Callable[[], float] | None = None, backend: str = "gloo"
    ) -> None:
        self.pool = pool
        self.parity_check = parity_check
        self.backend = backend
        self.history: list[dict] = []

    def init_weight_transfer(self) -> None:
        pass  # the pool builds its group on the first sync

    def pause(self) -> None:
        self.pool.pause()

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        result = self.pool.sync_weights(iterator, backend=self.backend)
        self.history.append(result)

    def resume(self) -> None:
        self.pool.resume()
        if self.parity_check is not None and self.history:
            self.history[-1]["logprob_max_abs_diff"] = self.parity_check()

    def destroy(self) -> None:
        pass
