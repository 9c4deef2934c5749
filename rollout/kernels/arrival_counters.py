"""Zeroed int32 counters for kernels whose last-arriving program finishes a shared result.

The decode attention merges a (sequence, KV head)'s pieces in the program that arrives last, the
decode GEMM sums a column block's K slices the same way: each program adds one to its block's
counter, and the one that sees the count complete does the rest and sets the counter back to 0,
so the buffer is zero again for the next launch without a launch of its own.

One buffer per device and CUDA stream: launches on one stream are ordered, so they may share
counters, while two engines stepping on their own streams must not. Buffers live as long as the
process: a captured CUDA graph holds the address it was captured with, so an outgrown buffer is
kept (never freed for its memory to be reused) and a larger one made beside it.
"""

from __future__ import annotations

import torch

MIN_COUNTERS = 1 << 16


class ArrivalCounters:
    def __init__(self) -> None:
        self._buffers: dict[tuple, list[torch.Tensor]] = {}

    def get(self, device: torch.device, count: int) -> torch.Tensor | None:
        """At least `count` zeroed counters on `device` for the current stream; None where a
        larger buffer would have to be made during a CUDA-graph capture (memory made there
        belongs to that graph), which the caller must handle."""
        device = torch.device(device)
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        buffers = self._buffers.setdefault((device, stream), [])
        if not buffers or buffers[-1].numel() < count:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return None
            buffers.append(torch.zeros(max(count, MIN_COUNTERS), dtype=torch.int32, device=device))
        return buffers[-1]


ARRIVALS = ArrivalCounters()
