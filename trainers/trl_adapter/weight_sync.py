"""The weights' way from the trainer to the rollout pool, in both modes. It follows
AsyncGRPOTrainer's weight-transfer protocol (pause, send, resume), which the streaming trainer
drives (`sharded.py`: every rank gathers, rank 0 sends); in sync mode
`sync.WeightsBeforeGeneration` drives it before each generation that follows an optimizer step.
The parity probe (`parity.py`) runs after each sync and writes into `history`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class PoolWeightTransfer:
    """AsyncGRPOTrainer's weight transfer, over the pool: full weights, or a LoRA adapter."""

    def __init__(self, pool, backend: str = "gloo") -> None:
        self.pool = pool
        self.backend = backend
        self.history: list[dict] = []
        """One entry per sync: seconds, bytes, version, and the parity probe's gap."""

    def init_weight_transfer(self) -> None:
        pass  # the pool builds its group on the first sync

    def pause(self) -> None:
        self.pool.pause()

    def send_weights(self, iterator: Iterator[tuple[str, Any]], specs=None, device=None) -> None:
        """Every parameter; with `specs` ((name, shape) in the iterator's order), pulled bucket
        by bucket as the transfer goes (each pull may be a gather across the trainer's ranks)."""
        result = self.pool.sync_weights(iterator, backend=self.backend, specs=specs, device=device)
        self.history.append(result)

    def send_adapter(self, adapter: list) -> None:
        """A LoRA adapter, (module, lora_A, lora_B, scaling) per layer: the actors merge it."""
        self.history.append(self.pool.sync_adapter(adapter, backend=self.backend))

    def resume(self) -> None:
        self.pool.resume()

    def destroy(self) -> None:
        pass
