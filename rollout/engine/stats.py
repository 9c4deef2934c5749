"""EngineStats: what an engine reports about itself (`LLMEngine.stats()`), read from its parts.

Everything outside the engine that watches it (the rollout actors' metrics, the benchmarks)
reads this snapshot instead of the scheduler, the block manager or the runner. Counters run from
the engine's construction, or from its last `reset_stats()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout.engine.scheduling.speculation import SpeculationStats

if TYPE_CHECKING:
    from rollout.engine.execution.model_runner import ModelRunner
    from rollout.engine.scheduling.block_manager import BlockManager
    from rollout.engine.scheduling.scheduler import Scheduler


@dataclass(frozen=True)
class EngineStats:
    running_sequences: int
    """Sequences holding KV blocks, being prefilled or decoding (a request of n samples is one
    sequence until its prompt is computed, then n)."""
    waiting_sequences: int
    """Sequences queued for their prefill, or their recompute after a preemption."""
    running_output_tokens: int
    """Tokens the running samples have generated so far (not yet in a completion)."""
    num_kv_blocks: int
    free_kv_blocks: int
    """Blocks no sequence holds, cached prefix blocks included (they are reused when needed)."""
    cached_kv_blocks: int
    """Blocks that keep a finished request's KV for the prefix cache."""
    steps: int
    """Engine steps run (one forward each)."""
    preemptions: int
    prefix_hit_tokens: int
    """Prompt tokens whose KV came from the prefix cache instead of being computed."""
    speculation: SpeculationStats
    """Speculative decoding's counts (all zero when it is off)."""
    host_wait_s: float
    """Host seconds spent waiting for the device's results (the rest of a step is host work)."""
    device_s: float | None
    """Device seconds of the steps' compute, once `measure_device_time()` was called (None
    before); on CPU, host clocks around the same work."""
    cuda_graphs: int
    """Decode graphs captured so far (0 off CUDA)."""
    fp8_round_s: float | None = None
    """Seconds the last rounding of the weights to FP8 took (at load, or after the last weight
    update); None without weight_quantization="fp8"."""

    @property
    def kv_cache_use(self) -> float:
        """The share of the KV blocks that sequences hold."""
        return 1.0 - self.free_kv_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0


def collect_stats(
    scheduler: Scheduler, block_manager: BlockManager, runner: ModelRunner, steps: int
) -> EngineStats:
    running = list(scheduler.running)  # another thread may be stepping the engine
    return EngineStats(
        running_sequences=len(running),
        waiting_sequences=len(scheduler.waiting),
        running_output_tokens=sum(s.num_output_tokens for s in running),
        num_kv_blocks=block_manager.num_blocks,
        free_kv_blocks=block_manager.num_free_blocks,
        cached_kv_blocks=block_manager.num_cached_blocks,
        steps=steps,
        preemptions=scheduler.num_preemptions,
        prefix_hit_tokens=scheduler.num_prefix_hit_tokens,
        speculation=dataclasses.replace(scheduler.speculation.stats),
        host_wait_s=runner.host_wait_s,
        device_s=runner.timing.total_s() if runner.timing is not None else None,
        cuda_graphs=len(runner.graphs) if runner.graphs is not None else 0,
        fp8_round_s=fp8.last_round_s if (fp8 := runner.prepared.fp8_weights) else None,
    )


def reset_counters(scheduler: Scheduler, runner: ModelRunner) -> None:
    """Zero the counters `collect_stats` reports (the step count is the caller's)."""
    scheduler.num_preemptions = 0
    scheduler.num_prefix_hit_tokens = 0
    scheduler.speculation.stats = SpeculationStats()
    runner.host_wait_s = 0.0
    if runner.timing is not None:
        runner.timing.reset()
