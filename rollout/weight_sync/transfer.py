"""Weight sync's two ends: the trainer sends its parameters, each engine copies them in place.

Parameters travel by transformers name, cast to the rollout dtype and packed into buckets; the
transport for the group's backend moves the buckets (`broadcast` for gloo and NCCL, `cuda_ipc`
for a trainer and an engine on one GPU). Each receiver copies in place into its engine's
parameters, so CUDA graphs captured on those tensors stay valid.
"""

from __future__ import annotations

from collections.abc import Iterable

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


class TornWeightsError(RuntimeError):
    """A transfer broke after some buckets were copied in: the model holds two weight versions."""


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

    numels = [manifest.bucket_numel(b) for b in buckets]
    transport = TRANSPORTS[group.backend]
    return transport.send_buckets(group, buckets, numels, manifest.torch_dtype, device, pack)


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

    buckets = manifest.buckets()
    numels = [manifest.bucket_numel(b) for b in buckets]
    device = next(iter(params.values())).device
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
                f"parameters were copied in: {err}"
            ) from err
        raise


def _pack_into(out: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Cast and copy `tensors` one after another into the flat `out`."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            out[offset : offset + n].copy_(t.detach().reshape(-1))
            offset += n
