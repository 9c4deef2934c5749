"""Weight sync between processes that share one GPU, through CUDA IPC instead of a broadcast.

NCCL refuses two ranks on one device, and gloo would route every byte through host memory and
TCP (an 8B model is 16 GB of bf16). Here the trainer packs each bucket into one staging buffer
on its GPU and shares that buffer's CUDA IPC handle once per sync; each engine maps it and copies
the bucket straight into its parameters, device to device. The weight group's gloo connection
only carries the handle and two tiny all-reduces per bucket, which order the steps:

    trainer: pack bucket k, wait for the GPU   -> all-reduce "ready" ->
    engines:                                      copy out, wait for the GPU -> all-reduce "done"
    trainer: may overwrite the buffer with bucket k + 1

A handle is only valid on the physical GPU it came from: both sides compare the device's UUID
and refuse with an error that says so.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import torch
from torch.multiprocessing.reductions import reduce_tensor

# Position of the device index among the arguments torch's reduce_tensor gives for a CUDA tensor
# (tensor class, size, stride, offset, storage class, dtype, device, handle, ...). The receiver
# puts its own index there: the two processes may number the same GPU differently.
_DEVICE_ARG = 6


def send_buckets(
    group,
    buckets: list[list[int]],
    numels: list[int],
    dtype: torch.dtype,
    device: torch.device,
    pack: Callable[[list[int], torch.Tensor], None],
) -> int:
    """Trainer side: `pack(bucket, out)` fills `out` with one bucket; returns bytes shared."""
    if device.type != "cuda":
        raise ValueError(
            "weight sync over cuda_ipc needs the trainer's weights on a GPU; they are on "
            f"{device}. Use rollout.weight_sync_backend=gloo"
        )
    staging = torch.empty(max(numels), dtype=dtype, device=device)
    rebuild, args = reduce_tensor(staging)
    _broadcast_bytes(group, pickle.dumps((_device_uuid(device), rebuild, args)))
    if _failures(group, 0):
        raise RuntimeError(
            "weight sync over cuda_ipc refused: an engine is not on the trainer's GPU "
            f"({_device_uuid(device)}); use nccl between GPUs. The rollout weights are unchanged"
        )
    sent = 0
    for bucket, numel in zip(buckets, numels, strict=True):
        pack(bucket, staging[:numel])
        torch.cuda.current_stream(device).synchronize()
        _step(group)  # ready: the engines copy it out now
        _step(group)  # done: every engine has its copy
        sent += numel * staging.element_size()
    del staging
    return sent


def receive_buckets(
    group,
    buckets: list[list[int]],
    numels: list[int],
    device: torch.device,
    unpack: Callable[[list[int], torch.Tensor], None],
) -> int:
    """Engine side: map the trainer's staging buffer and `unpack(bucket, flat)` each bucket."""
    uuid, rebuild, args = pickle.loads(_broadcast_bytes(group, None))
    here = _device_uuid(device) if device.type == "cuda" else str(device)
    # Everyone learns of a mismatch before any bucket moves, so no side waits for the others.
    if _failures(group, int(here != uuid)):
        raise RuntimeError(
            "weight sync over cuda_ipc needs the trainer and the engine on the same GPU; "
            f"the trainer's is {uuid}, this engine's is {here}. Use nccl between GPUs"
        )
    args = list(args)
    args[_DEVICE_ARG] = device.index if device.index is not None else torch.cuda.current_device()
    staging = rebuild(*args)
    received = 0
    for bucket, numel in zip(buckets, numels, strict=True):
        _step(group)  # ready
        unpack(bucket, staging[:numel])
        torch.cuda.current_stream(device).synchronize()
        _step(group)  # done
        received += numel * staging.element_size()
    # Unmapping lets the trainer's allocator reuse the buffer's memory.
    del staging
    return received


def _failures(group, mine: int) -> int:
    """Sum over ranks of `mine` (0 or 1): how many members cannot go on."""
    flag = torch.tensor([float(mine)])
    group.allreduce(flag)
    return int(flag.item())


def _step(group) -> None:
    """A barrier over the weight group's gloo connection (everyone waits for everyone)."""
    group.allreduce(torch.zeros(1))


def _broadcast_bytes(group, payload: bytes | None) -> bytes:
    """Rank 0 sends `payload`; every rank returns it."""
    size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    group.broadcast(size)
    data = torch.zeros(int(size.item()), dtype=torch.uint8)
    if payload is not None:
        data.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    group.broadcast(data)
    return data.numpy().tobytes()


def _device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)
