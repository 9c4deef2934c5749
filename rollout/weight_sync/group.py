"""The trainer + engines process group (rank 0 is the trainer), apart from the trainer's own.

It is built from a TCP store with the backend classes directly, so it never touches a default
process group the trainer may run under: NCCL between GPUs, gloo on CPU, and gloo carrying only
handles and barriers when the trainer and an engine share one GPU (`cuda_ipc`).
"""

from __future__ import annotations

import datetime
import socket

import torch

BACKENDS = ("gloo", "nccl", "cuda_ipc")


class WeightGroup:
    """One end of the group."""

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float = 600.0,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"weight sync backend must be one of {BACKENDS}; got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.store = torch.distributed.TCPStore(
            host, port, world_size, is_master=rank == 0, timeout=timeout
        )
        if backend in ("gloo", "cuda_ipc"):  # cuda_ipc: gloo carries only handles and barriers
            self.group = torch.distributed.ProcessGroupGloo(self.store, rank, world_size, timeout)
        else:
            # With a timeout, a sync that cannot proceed fails (NCCL's watchdog aborts it)
            # instead of hanging both sides for good.
            options = torch.distributed.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = torch.distributed.ProcessGroupNCCL(self.store, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor) -> None:
        options = torch.distributed.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.group.allreduce([tensor]).wait()

    def close(self) -> None:
        """Let go of this end of the group. Over gloo its connections close with it, so members
        blocked in a collective with this rank fail at once instead of waiting out the timeout
        (call it once no collective of this rank is running)."""
        self.group = None
        self.store = None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
