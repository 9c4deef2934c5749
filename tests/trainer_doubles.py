"""Stand-ins for what a weight sync calls on the trainer's side: accelerate's Accelerator as
one CPU process has it, and a PoolWeightTransfer that records what it was asked."""

from __future__ import annotations


class RecordingTransfer:
    """PoolWeightTransfer's surface, recording what the sync asked of the pool."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def send_weights(self, named, specs=None, device=None) -> None:
        self.calls.append(f"send {len(list(named))}")

    def resume(self) -> None:
        self.calls.append("resume")


class OneProcess:
    """accelerate's Accelerator as one process on CPU has it, for what the sync calls."""

    num_processes = 1
    is_main_process = True
    device = "cpu"

    def wait_for_everyone(self) -> None:
        pass

    def unwrap_model(self, model):
        return model
