"""The gloo / NCCL transport: each bucket is one broadcast from the trainer to every engine."""

from __future__ import annotations

import torch

from rollout.weight_sync.base import Pack
from rollout.weight_sync.group import WeightGroup


def send_buckets(
    group: WeightGroup,
    buckets: list[list[int]],
    numels: list[int],
    dtype: torch.dtype,
    device: torch.device,
    pack: Pack,
) -> int:
    sent = 0
    for bucket, numel in zip(buckets, numels, strict=True):
        flat = torch.empty(numel, dtype=dtype, device=device)
        pack(bucket, flat)
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    _wait_for_device(device)
    return sent


def receive_buckets(
    group: WeightGroup,
    buckets: list[list[int]],
    numels: list[int],
    dtype: torch.dtype,
    device: torch.device,
    unpack: Pack,
) -> int:
    received = 0
    for bucket, numel in zip(buckets, numels, strict=True):
        flat = torch.empty(numel, dtype=dtype, device=device)
        group.broadcast(flat)
        unpack(bucket, flat)
        received += flat.numel() * flat.element_size()
    _wait_for_device(device)
    return received


def _wait_for_device(device: torch.device) -> None:
    # With NCCL, wait() only orders the current stream after the collective; the host returns at
    # once. Block here so that a sync's reported time covers the transfer and the copies, and the
    # caller's "done" means done.
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
