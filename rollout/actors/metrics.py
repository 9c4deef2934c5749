"""Rollout metrics measured inside a worker, reported as plain dicts (the trainer logs them)."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rollout.actors.messages import FinishedSample
    from rollout.engine.llm_engine import LLMEngine
    from rollout.engine.scheduling.speculation import SpeculationStats


class WorkerMetrics:
    """Windowed counters over the last `window_s` seconds of one worker's engine."""

    def __init__(self, engine: LLMEngine, window_s: float = 30.0) -> None:
        self.engine = engine
        self.window_s = window_s
        self._steps: deque[tuple[float, float]] = deque()  # (end time, host seconds)
        self._tokens: deque[tuple[float, int]] = deque()  # (finish time, generated tokens)
        self._latencies: deque[tuple[float, float]] = deque()  # (finish time, seconds)
        self._queue_waits: deque[tuple[float, float]] = deque()  # (finish time, seconds)
        self.total_tokens = 0
        self.total_sequences = 0
        # Device time per step gives the GPU-busy fraction; events are cheap, CPU uses host clocks.
        engine.measure_device_time()
        self._device_s_seen = 0.0
        self._speculation_seen = (0, 0, 0, 0)  # verifications, drafted, accepted, emitted

    def record_step(self, host_s: float) -> None:
        now = time.monotonic()
        self._steps.append((now, host_s))
        self._trim(now)

    def record_finished(self, sample: FinishedSample) -> None:
        now = time.monotonic()
        self._tokens.append((now, len(sample.token_ids)))
        self._latencies.append((now, sample.finished_at - sample.received_at))
        self._queue_waits.append((now, sample.queue_wait_s))
        self.total_tokens += len(sample.token_ids)
        self.total_sequences += 1

    def snapshot(self, version: int, outstanding_groups: int) -> dict[str, float]:
        now = time.monotonic()
        self._trim(now)
        span = self.window_s
        stats = self.engine.stats()
        steps = len(self._steps)
        device_total = stats.device_s or 0.0
        device_s, self._device_s_seen = device_total - self._device_s_seen, device_total
        host_s = sum(h for _, h in self._steps)
        values = {
            "tokens_per_s": sum(n for _, n in self._tokens) / span,
            "steps_per_s": steps / span,
            "cpu_ms_per_step": 1e3 * host_s / steps if steps else 0.0,
            "running_sequences": float(stats.running_sequences),
            "waiting_sequences": float(stats.waiting_sequences),
            "kv_cache_use": stats.kv_cache_use,
            "preemptions": float(stats.preemptions),
            "latency_s": _mean(self._latencies),
            "queue_wait_s": _mean(self._queue_waits),
            "weight_version": float(version),
            "outstanding_groups": float(outstanding_groups),
            "total_tokens": float(self.total_tokens),
            "total_sequences": float(self.total_sequences),
        }
        if self.engine.device.type == "cuda":  # device time over host step time
            values["gpu_busy"] = min(1.0, device_s / host_s) if host_s else 0.0
            # What this process holds on its GPU: weights, KV cache, a LoRA base snapshot.
            values["gpu_memory_gib"] = torch.cuda.memory_reserved(self.engine.device) / 2**30
        if self.engine.config.speculative != "none":
            values.update(self._speculation_since_last(stats.speculation))
        return values

    def _speculation_since_last(self, stats: SpeculationStats) -> dict[str, float]:
        """Speculative decoding since the previous snapshot: the share of drafted tokens
        accepted, and the tokens each verification yielded (1 = no gain)."""
        now = (stats.verifications, stats.drafted, stats.accepted, stats.emitted)
        verifications, drafted, accepted, emitted = (
            a - b for a, b in zip(now, self._speculation_seen, strict=True)
        )
        self._speculation_seen = now
        return {
            "spec_acceptance_rate": accepted / drafted if drafted else 0.0,
            "spec_tokens_per_verification": emitted / verifications if verifications else 0.0,
            "spec_verifications": float(verifications),
        }

    def _trim(self, now: float) -> None:
        for items in (self._steps, self._tokens, self._latencies, self._queue_waits):
            while items and now - items[0][0] > self.window_s:
                items.popleft()


def _mean(items: deque[tuple[float, float]]) -> float:
    return sum(value for _, value in items) / len(items) if items else 0.0
