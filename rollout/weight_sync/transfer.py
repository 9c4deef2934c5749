"""Weight sync's two ends: the trainer sends its tensors, each engine copies them in place.

Tensors travel by name, cast to the manifest's dtype and packed into buckets; the transport for
the group's backend moves the buckets (`broadcast` for gloo and NCCL, `cuda_ipc` for a trainer
and an engine on one GPU). Each receiver copies in place into its destination tensors: the
engine's parameters for full weights (so CUDA graphs captured on them stay valid), or buffers of
its own for a LoRA adapter that it merges afterwards.

The trainer's tensors are read one of two ways: looked up by name (`lazy=False`: the caller
holds them all), or pulled in manifest order just before each bucket is packed (`lazy=True`: a
sharded trainer gathers each full tensor as it is pulled, so only one bucket's worth exists at a
time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import torch

import rollout.weight_sync.broadcast as broadcast
import rollout.weight_sync.cuda_ipc as cuda_ipc
from rollout.weight_sync.base import WeightTransport
from rollout.weight_sync.group import WeightGroup
from rollout.weight_sync.manifest import WeightManifest

TRANSPORTS: dict[str, WeightTransport] = {
    "gloo": broadcast,
    "nccl": broadcast,
    "cuda_ipc": cuda_ipc,
}

TakeBucket = Callable[[list[int]], list[torch.Tensor]]


class TornWeightsError(RuntimeError):
    """A transfer broke after some buckets were copied in: the model holds two weight versions."""


def send_weights(
    group: WeightGroup,
    manifest: WeightManifest,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    *,
    lazy: bool = False,
    before_bucket: Callable[[], None] | None = None,
) -> int:
    """Trainer side: pack and send every bucket; returns bytes sent. With `lazy`, the tensors
    must come in the manifest's order (a different name raises ValueError naming both).
    `before_bucket` runs before each bucket's tensors are taken: what it raises ends the send
    there (the caller's check that every receiver is still there)."""
    if lazy:
        take = _pulled_in_order(manifest, iter(named_tensors))
    else:
        take = _looked_up_by_name(manifest, dict(named_tensors))

    def pack(bucket: list[int], out: torch.Tensor) -> None:
        if before_bucket is not None:
            before_bucket()
        _pack_into(out, take(bucket))

    buckets = manifest.buckets()
    numels = [manifest.bucket_numel(b) for b in buckets]
    transport = TRANSPORTS[group.backend]
    return transport.send_buckets(group, buckets, numels, manifest.torch_dtype, device, pack)


def receive_weights(group: WeightGroup, manifest: WeightManifest, model: torch.nn.Module) -> int:
    """Engine side: receive every bucket into the model's parameters, in place (see
    `receive_into`)."""
    return receive_into(group, manifest, dict(model.named_parameters()))


def receive_into(
    group: WeightGroup, manifest: WeightManifest, destinations: Mapping[str, torch.Tensor]
) -> int:
    """Engine side: receive every bucket and copy each tensor in place into the destination of
    its name (cast to that tensor's dtype); returns bytes received.

    A failure after the first copy raises TornWeightsError (the destinations now hold two
    versions); a failure before it leaves them whole and raises as it is."""
    copied = [0]  # tensors copied in so far

    def unpack(bucket: list[int], flat: torch.Tensor) -> None:
        offset = 0
        for i in bucket:
            destination = destinations[manifest.names[i]]
            n = destination.numel()
            destination.copy_(flat[offset : offset + n].view(destination.shape))
            offset += n
        copied[0] += len(bucket)

    buckets = manifest.buckets()
    numels = [manifest.bucket_numel(b) for b in buckets]
    device = next(iter(destinations.values())).device
    transport = TRANSPORTS[group.backend]
    try:
        with torch.no_grad():
            return transport.receive_buckets(
                group, buckets, numels, manifest.torch_dtype, device, unpack
            )
    except Exception as err:
        if copied[0]:
            raise TornWeightsError(
                f"the weight transfer broke after {copied[0]} of {len(manifest.names)} "
                f"tensors were copied in: {err}"
            ) from err
        raise


def _looked_up_by_name(manifest: WeightManifest, tensors: Mapping[str, torch.Tensor]) -> TakeBucket:
    return lambda bucket: [tensors[manifest.names[i]] for i in bucket]


def _pulled_in_order(
    manifest: WeightManifest, iterator: Iterator[tuple[str, torch.Tensor]]
) -> TakeBucket:
    """Each bucket's tensors, pulled from `iterator` when the bucket is packed. Nothing past the
    manifest's last tensor is pulled: for a sharded trainer, each pull is a collective."""
    next_index = [0]

    def take(bucket: list[int]) -> list[torch.Tensor]:
        assert bucket[0] == next_index[0], "transports pack buckets in order, each once"
        tensors = []
        for i in bucket:
            expected = manifest.names[i]
            pulled = next(iterator, None)
            if pulled is None:
                raise ValueError(
                    f"weight sync: the tensors ran out before {expected!r} (tensor {i + 1} of "
                    f"{len(manifest.names)} in the specs); yield every tensor the specs list"
                )
            name, tensor = pulled
            if name != expected:
                raise ValueError(
                    f"weight sync: the specs list {expected!r} as tensor {i + 1}, the tensors "
                    f"yielded {name!r}; yield them in the order of the specs"
                )
            if tuple(tensor.shape) != manifest.shapes[i]:
                raise ValueError(
                    f"weight sync: {name} has shape {list(tensor.shape)}, the specs say "
                    f"{list(manifest.shapes[i])}"
                )
            tensors.append(tensor)
        next_index[0] = bucket[-1] + 1
        return tensors

    return take


def _pack_into(out: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Cast and copy `tensors` one after another into the flat `out`."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            out[offset : offset + n].copy_(t.detach().reshape(-1))
            offset += n
