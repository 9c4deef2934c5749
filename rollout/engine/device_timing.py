"""Device time of each step's compute, from event pairs on the compute stream (benchmarks only).

Busy fraction = sum of step device times / wall time. In the overlap loop, step N+1's start event
fires as soon as step N ends if the host queued it in time, so gaps are exactly device idle time.
On CPU, host clocks stand in for events.
"""

from __future__ import annotations

import time

import torch


class DeviceTiming:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pairs: list = []
        self._cpu_total = 0.0

    def begin(self):
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def end(self, start) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pairs.append((start, end))
        else:
            self._cpu_total += time.perf_counter() - start

    def step_times_s(self) -> list[float]:
        """Device seconds per step (synchronizes; call after the run)."""
        if not self.cuda:
            return []
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in self._pairs]

    def total_s(self) -> float:
        return sum(self.step_times_s()) if self.cuda else self._cpu_total
