"""Weight sync from the trainer (rank 0) to the rollout engines over a dedicated process group.

The group is built from a TCP store with the backend classes directly (gloo on CPU, NCCL between
GPUs, and gloo carrying CUDA IPC handles when the trainer and an engine share one GPU: see
`rollout.weight_sync.cuda_ipc`), so it never touches the trainer's own default process group. Parameters
travel by transformers name, cast to the rollout dtype and packed into buckets (one broadcast
each); each receiver copies them in place into its engine's parameters, so CUDA graphs captured
on those tensors stay valid.
Names and shapes are checked against every engine before any tensor moves: a mismatch raises an
error that names the offending parameters and leaves the old weights whole.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rollout.engine.model_loader import TORCH_DTYPES
from rollout.weight_sync import cuda_ipc

BACKENDS = ("gloo", "nccl", "cuda_ipc")

DEFAULT_BUCKET_BYTES = 1 << 30


@dataclass(frozen=True)
class WeightManifest:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    """Rollout dtype every tensor is cast to before it is sent."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    def buckets(self) -> list[list[int]]:
        """Parameter indices per broadcast, in order; a tensor larger than the cap goes alone."""
        element = torch.empty((), dtype=self.torch_dtype).element_size()
        buckets, current, size = [], [], 0
        for i, shape in enumerate(self.shapes):
            nbytes = _numel(shape) * element
            if current and size + nbytes > self.bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            buckets.append(current)
        return buckets


def manifest_for(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int
) -> WeightManifest:
    names, shapes = [], []
    for name, tensor in named_tensors:
        names.append(name)
        shapes.append(tuple(tensor.shape))
    dtype_name = next(k for k, v in TORCH_DTYPES.items() if v == dtype)
    return WeightManifest(tuple(names), tuple(shapes), dtype_name, bucket_bytes)


def check_manifest(model: torch.nn.Module, manifest: WeightManifest) -> None:
    """Raise ValueError naming every parameter the model lacks, has extra, or shapes differently."""
    params = dict(model.named_parameters())
    missing = [n for n in manifest.names if n not in params]
    extra = [n for n in params if n not in set(manifest.names)]
    wrong = [
        f"{n}: sent {list(shape)}, engine has {list(params[n].shape)}"
        for n, shape in zip(manifest.names, manifest.shapes, strict=True)
        if n in params and tuple(params[n].shape) != tuple(shape)
    ]
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"not in the rollout model: {missing[:8]}")
        if extra:
            parts.append(f"not sent by the trainer: {extra[:8]}")
        if wrong:
            parts.append(f"shape mismatch: {wrong[:8]}")
        raise ValueError(
            "weight sync refused, the trainer and rollout models differ ("
            + "; ".join(parts)
            + "); the rollout weights are unchanged"
        )


class WeightGroup:
    """One end of the trainer + engines process group (rank 0 is the trainer)."""

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


def send_weights(
    group: WeightGroup,
    manifest: WeightManifest,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
) -> int:
    """Trainer side: pack and send every bucket; returns bytes sent."""
    tensors = dict(named_tensors)
    buckets = manifest.buckets()

    def pack(bucket: list[int], out: torch.Tensor) -> None:
        _pack_into(out, [tensors[manifest.names[i]] for i in bucket])

    if group.backend == "cuda_ipc":
        numels = [_bucket_numel(manifest, b) for b in buckets]
        return cuda_ipc.send_buckets(group, buckets, numels, manifest.torch_dtype, device, pack)
    sent = 0
    for bucket in buckets:
        flat = torch.empty(
            _bucket_numel(manifest, bucket), dtype=manifest.torch_dtype, device=device
        )
        pack(bucket, flat)
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    _wait_for_device(device)
    return sent


class TornWeightsError(RuntimeError):
    """A transfer broke after some buckets were copied in: the model holds two weight versions."""


def receive_weights(group: WeightGroup, manifest: WeightManifest, model: torch.nn.Module) -> int:
    """Engine side: receive every bucket and copy it in place into the model's parameters.

    A failure after the first copy raises TornWeightsError (the model now holds two versions);
    a failure before it leaves the weights whole and raises as it is."""
    params = dict(model.named_parameters())
    copied = [0]  # parameters copied in so far

    def unpack(bucket: list[int], flat: torch.Tensor) -> None:
        offset = 0
        for i in bucket:
            param = params[manifest.names[i]]
            n = param.numel()
            param.copy_(flat[offset : offset + n].view(param.shape))
            offset += n
        copied[0] += len(bucket)

    try:
        with torch.no_grad():
            return _receive(group, manifest, next(iter(params.values())).device, unpack)
    except Exception as err:
        if copied[0]:
            raise TornWeightsError(
                f"the weight transfer broke after {copied[0]} of {len(manifest.names)} "
                f"parameters were copied in: {err}"
            ) from err
        raise


def _receive(group: WeightGroup, manifest: WeightManifest, device: torch.device, unpack) -> int:
    buckets = manifest.buckets()
    if group.backend == "cuda_ipc":
        numels = [_bucket_numel(manifest, b) for b in buckets]
        return cuda_ipc.receive_buckets(group, buckets, numels, device, unpack)
    received = 0
    for bucket in buckets:
        numel = _bucket_numel(manifest, bucket)
        flat = torch.empty(numel, dtype=manifest.torch_dtype, device=device)
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _pack_into(out: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Cast and copy `tensors` one after another into the flat `out`."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            out[offset : offset + n].copy_(t.detach().reshape(-1))
            offset += n


def _bucket_numel(manifest: WeightManifest, bucket: list[int]) -> int:
    return sum(_numel(manifest.shapes[i]) for i in bucket)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
