"""Device time of each step's compute, from event pairs on the compute stream, once measured.

Busy fraction = sum of step device times / wall time. In the overlap loop, step N+1's start event
fires as soon as step N ends if the host queued it in time, so gaps are exactly device idle time.
On CPU, host clocks stand in for events.
"""

from __future__ import annotations

import time
from collections import deque

import torch


class DeviceTiming:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pairs: deque = deque()
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

    def total_s(self) -> float:
        """Device seconds of all steps whose end event has completed; never waits on the device.
        Completed pairs are folded into a running total, so long runs keep no event backlog."""
        if not self.cuda:
            return self._cpu_total
        while self._pairs and self._pairs[0][1].query():
            start, end = self._pairs.popleft()
            self._cpu_total += start.elapsed_time(end) / 1e3
        return self._cpu_total

    def reset(self) -> None:
        """Count from zero (steps still on the device are left out)."""
        self._pairs.clear()
        self._cpu_total = 0.0
