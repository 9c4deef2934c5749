"""CUDA streams and events for the step pipeline; no-ops on CPU, so both share one code path."""

from __future__ import annotations

from contextlib import nullcontext

import torch


class _NoEvent:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class StepStreams:
    """copy-in (host to device), compute, copy-out (device to host)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.copy_in = torch.cuda.Stream(device)
            self.compute = torch.cuda.Stream(device)
            self.copy_out = torch.cuda.Stream(device)
        else:
            self.copy_in = self.compute = self.copy_out = None

    def new_event(self):
        return torch.cuda.Event() if self.cuda else _NoEvent()

    def on(self, stream):
        """Context that makes `stream` current (nothing on CPU)."""
        return torch.cuda.stream(stream) if self.cuda else nullcontext()

    def wait(self, stream, event) -> None:
        """Make `stream` wait on the device for `event` (the host does not block)."""
        if self.cuda:
            stream.wait_event(event)
