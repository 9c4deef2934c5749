"""Weight sync between processes that share one GPU, through CUDA IPC instead of a broadcast.

NCCL refuses two ranks on one device, and gloo would route every byte through host memory and
TCP (an 8B model is 16 GB of bf16). Here the trainer packs each bucket into one staging buffer
on its GPU and shares that buffer's CUDA IPC handle once per sync; each engine maps it and copies
the bucket straight into its parameters, device to device. The weight group's gloo connection
only carries the handle and two tiny all-reduces per bucket, which order the steps:

    trainer: pack bucket k, wait for the GPU   -> all-reduce "ready" ->
    engines:                                      copy out, wait for the GPU -> all-reduce "done"
    trainer: may overwrite the buffer with bucket k + 1

Each all-reduce sums failure flags, so an error on any side (a handle that cannot be mapped, a
failed copy) makes every member raise at once instead of waiting for the group's timeout.

A handle is only valid on the physical GPU it came from: both sides compare the device's UUID
and refuse with an error that says so.
"""

from __future__ import annotations

import pickle

import torch
from torch.multiprocessing.reductions import reduce_tensor

from rollout.weight_sync.base import Pack
from rollout.weight_sync.group import WeightGroup

# Position of the device index among the arguments torch's reduce_tensor gives for a CUDA tensor
# (tensor class, size, stride, offset, storage class, dtype, device, handle, ...). The receiver
# puts its own index there: the two processes may number the same GPU differently.
_DEVICE_ARG = 6


def send_buckets(
    group: WeightGroup,
    buckets: list[list[int]],
    numels: list[int],
    dtype: torch.dtype,
    device: torch.device,
    pack: Pack,
) -> int:
    """Trainer side: `pack(bucket, out)` fills `out` with one bucket; returns bytes shared."""
    _require_gpu(device)
    staging = torch.empty(max(numels), dtype=dtype, device=device)
    _broadcast_bytes(group, _share(staging))
    if _failures(group, None):
        raise RuntimeError(
            "weight sync over cuda_ipc refused: an engine could not map the trainer's buffer "
            "(its error is in the actor's log; an engine on another GPU needs nccl). The rollout "
            "weights are unchanged"
        )
    sent = 0
    for k, (bucket, numel) in enumerate(zip(buckets, numels, strict=True)):
        error = None
        try:
            pack(bucket, staging[:numel])
            _wait_for(device)
        except Exception as e:  # the engines must hear of it, or they wait for the bucket
            error = e
        if _failures(group, error) or _failures(group, None):  # ready; then every copy done
            raise RuntimeError(
                f"weight sync over cuda_ipc failed at bucket {k + 1} of {len(buckets)} "
                f"({'the trainer: ' + repr(error) if error else 'an engine failed to copy it'}); "
                "the rollout weights are partly updated: sync again"
            ) from error
        sent += numel * staging.element_size()
    del staging
    return sent


def receive_buckets(
    group: WeightGroup,
    buckets: list[list[int]],
    numels: list[int],
    dtype: torch.dtype,
    device: torch.device,
    unpack: Pack,
) -> int:
    """Engine side: map the trainer's staging buffer and `unpack(bucket, flat)` each bucket
    (`dtype` is the buffer's own: the handle carries it).

    Every failure on any side is first announced to all members (an all-reduce of failure
    flags), so each side raises instead of waiting for the others until the group's timeout."""
    payload = _broadcast_bytes(group, None)
    error, staging = None, None
    try:
        staging = _map(payload, device)
    except Exception as e:
        error = e
    if _failures(group, error):
        raise error or RuntimeError("weight sync over cuda_ipc: another engine failed to map")
    received = 0
    for k, (bucket, numel) in enumerate(zip(buckets, numels, strict=True)):
        if _failures(group, None):  # ready, unless the trainer failed to pack
            raise RuntimeError(f"weight sync over cuda_ipc: the trainer failed at bucket {k + 1}")
        try:
            unpack(bucket, staging[:numel])
            _wait_for(device)
        except Exception as e:
            error = e
        if _failures(group, error):  # done
            raise error or RuntimeError(
                f"weight sync over cuda_ipc: bucket {k + 1} failed elsewhere"
            )
        received += numel * staging.element_size()
    # Unmapping lets the trainer's allocator reuse the buffer's memory.
    del staging
    return received


def _require_gpu(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(
            "weight sync over cuda_ipc needs the trainer's weights on a GPU; they are on "
            f"{device}. Use rollout.weight_sync_backend=gloo"
        )


def _share(staging: torch.Tensor) -> bytes:
    """The buffer's IPC handle, with the GPU's UUID, as bytes for the other processes."""
    rebuild, args = reduce_tensor(staging)
    return pickle.dumps((_device_uuid(staging.device), rebuild, args))


def _map(payload: bytes, device: torch.device) -> torch.Tensor:
    """The trainer's buffer in this process, on `device`, which must be the same GPU."""
    uuid, rebuild, args = pickle.loads(payload)
    here = _device_uuid(device) if device.type == "cuda" else str(device)
    if here != uuid:
        raise RuntimeError(
            "weight sync over cuda_ipc needs the trainer and the engine on the same GPU; "
            f"the trainer's is {uuid}, this engine's is {here}. Use nccl between GPUs"
        )
    args = list(args)
    args[_DEVICE_ARG] = device.index if device.index is not None else torch.cuda.current_device()
    return rebuild(*args)


def _wait_for(device: torch.device) -> None:
    torch.cuda.current_stream(device).synchronize()


def _failures(group, error: BaseException | None) -> int:
    """A barrier that also counts the members reporting an error (0: everyone may go on)."""
    flag = torch.tensor([0.0 if error is None else 1.0])
    group.allreduce(flag)
    return int(flag.item())


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
